"""Coordinate-wise median of the round's updates (Yin et al., ICML 2018; docs/method.md §10).

Robust while fewer than half of the updates are Byzantine. For an even number of updates the median is the mean of
the two middle values (numpy's convention; torch.median would return the lower one)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.types import ClientReport


@dataclass
class CoordinateMedian(GatherAllRule):
    uses_client_evaluation = False  # the updates only

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        ordered, rows = deltas.sort(dim=0)
        mid = ordered.shape[0] // 2
        if ordered.shape[0] % 2:
            self.record_effective(reports, rows[mid])
            return ordered[mid].to(torch.float64)
        self.record_effective(reports, rows[mid - 1:mid + 1])
        return (ordered[mid - 1].to(torch.float64) + ordered[mid].to(torch.float64)) / 2
