"""Bulyan (El Mhamdi, Guerraoui & Rouault, ICML 2018; docs/method.md §10). Gather-all: memory N x |theta| float32 plus
one n x n float64 Gram matrix.

Select theta = n - 2f updates by repeated Krum (each pass takes the lowest Krum score among the updates not yet
selected, scored against those same remaining updates), then per coordinate average the beta = theta - 2f selected
values closest to their median. Needs n >= 4f + 3."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.types import ClientReport


def squared_distances(deltas: torch.Tensor) -> torch.Tensor:
    """||d_i - d_j||^2 for every pair, from one float64 Gram matrix (n x n)."""
    x = deltas.to(torch.float64)
    gram = x @ x.T
    sq = gram.diagonal()
    return (sq[:, None] + sq[None, :] - 2 * gram).clamp_min(0)


def bulyan_selection(deltas: torch.Tensor, f: int) -> list[int]:
    """Row indices of the n - 2f updates repeated Krum selects, in selection order. Each pass scores the updates not
    yet selected against each other (their n' - f - 2 nearest, at least one), on the one distance matrix."""
    dist = squared_distances(deltas)
    dist.fill_diagonal_(float("inf"))  # a client is not its own neighbour
    remaining = list(range(deltas.shape[0]))
    chosen: list[int] = []
    for _ in range(deltas.shape[0] - 2 * f):
        k = max(1, len(remaining) - f - 2)
        idx = torch.tensor(remaining)
        scores = dist[idx][:, idx].sort(dim=1).values[:, :k].sum(dim=1)
        best = int(scores.argsort(stable=True)[0])
        chosen.append(remaining.pop(best))
    return chosen


@dataclass
class Bulyan(GatherAllRule):
    uses_client_evaluation = False  # the updates only
    on_parameters = True  # compares whole updates: on their parameters (base.py)
    f: int = 1  # Byzantine updates the rule must tolerate

    def __post_init__(self) -> None:
        if self.f < 0:
            raise ValueError(f"aggregation.f must be >= 0, got {self.f}")

    def check_clients(self, num_clients: int) -> None:
        if num_clients < 4 * self.f + 3:
            raise ValueError(f"aggregation Bulyan with f={self.f} needs at least 4f + 3 = {4 * self.f + 3} updates "
                             f"a round, got {num_clients}")

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        self.check_clients(deltas.shape[0])
        chosen = bulyan_selection(deltas, self.f)
        selected = deltas[chosen].to(torch.float64)
        keep = selected.shape[0] - 2 * self.f
        ordered, mid = selected.sort(dim=0).values, selected.shape[0] // 2
        median = ordered[mid] if selected.shape[0] % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        closest = (selected - median).abs().argsort(dim=0, stable=True)[:keep]
        client_rows = torch.tensor(chosen, device=closest.device)  # row j of `selected` is client row chosen[j]
        self.record_effective(reports, client_rows[closest])
        return selected.gather(0, closest).mean(dim=0)
