"""Krum and Multi-Krum (Blanchard et al., NeurIPS 2017; docs/method.md §10).

score(i) = sum of the squared distances from update i to its n - f - 2 nearest other updates; Krum returns the update
of lowest score, Multi-Krum(m) the mean of the m lowest (m = n - f when null). Needs n >= 2f + 3. The pairwise
distances come from one float64 Gram matrix (n x n)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.types import ClientReport


def krum_scores(deltas: torch.Tensor, f: int) -> torch.Tensor:
    """Each update's sum of squared distances to its n - f - 2 nearest others (float64, n values)."""
    x = deltas.to(torch.float64)
    gram = x @ x.T
    sq = gram.diagonal()
    dist = (sq[:, None] + sq[None, :] - 2 * gram).clamp_min(0)
    dist.fill_diagonal_(float("inf"))  # a client is not its own neighbour
    nearest = dist.sort(dim=1).values[:, : deltas.shape[0] - f - 2]
    return nearest.sum(dim=1)


@dataclass
class Krum(GatherAllRule):
    uses_client_evaluation = False  # the updates only
    on_parameters = True  # compares whole updates: on their parameters (base.py)
    f: int = 1  # Byzantine updates the rule must tolerate
    m: int | None = 1  # updates averaged: 1 = Krum, null = n - f (Multi-Krum)

    def __post_init__(self) -> None:
        if self.f < 0:
            raise ValueError(f"aggregation.f must be >= 0, got {self.f}")
        if self.m is not None and self.m < 1:
            raise ValueError(f"aggregation.m must be >= 1 or null, got {self.m}")

    def check_clients(self, num_clients: int) -> None:
        if num_clients < 2 * self.f + 3:
            raise ValueError(f"aggregation Krum with f={self.f} needs at least 2f + 3 = {2 * self.f + 3} updates a "
                             f"round, got {num_clients}")

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        n = deltas.shape[0]
        self.check_clients(n)  # the orchestrator skips such a round before calling; direct callers get the error
        m = n - self.f if self.m is None else min(self.m, n)
        chosen = krum_scores(deltas, self.f).argsort(stable=True)[:m]
        self.record_effective(reports, chosen)
        return deltas[chosen].to(torch.float64).mean(dim=0)
