"""Norm bounding (Sun et al. 2019, "Can you really backdoor federated learning?"; docs/method.md §10).

Each update is scaled to l2 norm <= M, then the round's updates are averaged with equal weight. M = the round's
median update norm (our reading: the paper leaves M open) or the fixed `bound`. Gather-all here (memory N x |theta|
float32): the median is a statistic of the whole round, and a streaming rule weighs a client by a softmax of its
report alone, which cannot express a factor that depends on the update itself."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.aggregation.robust_ops import norm_bound
from resfl_lightning.types import ClientReport


@dataclass
class NormBounding(GatherAllRule):
    uses_client_evaluation = False  # the updates only
    on_parameters = True  # compares whole updates: on their parameters (base.py)
    bound: float | None = None  # null: the round's median update norm

    def __post_init__(self) -> None:
        if self.bound is not None and not self.bound > 0:
            raise ValueError(f"aggregation.bound must be > 0 or null, got {self.bound}")

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        clipped, _ = norm_bound(deltas, self.bound)
        return clipped.mean(dim=0)
