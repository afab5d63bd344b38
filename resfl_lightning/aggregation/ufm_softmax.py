"""RESFL's rule: omega_i = exp(-beta u_i) / sum_j exp(-beta u_j) of the reported UFM u_i (docs/method.md §4)."""

from __future__ import annotations

from dataclasses import dataclass

from resfl_lightning.aggregation.base import StreamingRule
from resfl_lightning.types import ClientReport


@dataclass
class UfmSoftmax(StreamingRule):
    """beta -> 0 recovers uniform averaging."""

    beta: float = 2.0

    def __post_init__(self) -> None:
        if self.beta < 0:
            raise ValueError(f"algorithm.beta must be >= 0, got {self.beta}")

    def score(self, report: ClientReport) -> float:
        return -self.beta * report.u
