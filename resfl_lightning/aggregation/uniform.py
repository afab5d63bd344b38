"""Uniform averaging: every client weighs 1/N (PFU-FL's rule)."""

from __future__ import annotations

from dataclasses import dataclass

from resfl_lightning.aggregation.base import StreamingRule
from resfl_lightning.types import ClientReport


@dataclass
class Uniform(StreamingRule):
    uses_client_evaluation = False

    def score(self, report: ClientReport) -> float:
        return 0.0
