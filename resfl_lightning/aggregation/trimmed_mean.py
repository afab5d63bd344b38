"""Coordinate-wise trimmed mean (Yin et al., ICML 2018; docs/method.md §10): per coordinate, drop the floor(beta n)
largest and smallest of the round's n values and average the rest. Robust while the Byzantine share
f/n <= beta < 1/2."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.types import ClientReport


@dataclass
class TrimmedMean(GatherAllRule):
    beta: float = 0.1
    uses_client_evaluation = False  # the updates only

    def __post_init__(self) -> None:
        if not 0 <= self.beta < 0.5:
            raise ValueError(f"aggregation.beta must lie in [0, 0.5), got {self.beta}")

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        n = deltas.shape[0]
        k = math.floor(self.beta * n)
        ordered, rows = deltas.sort(dim=0)
        self.record_effective(reports, rows[k:n - k])
        return ordered[k:n - k].to(torch.float64).mean(dim=0)
