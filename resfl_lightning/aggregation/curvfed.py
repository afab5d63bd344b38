"""CurvFed's sharpness-aware rule: omega = softmax(1 / (l_i * lambda_i + eps)) (docs/method.md §4).

Lower evaluation loss l_i and a flatter client (smaller top Fisher eigenvalue lambda_i) weigh more; clients must
report lambda_i (algorithm.report_fim=true)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from resfl_lightning.aggregation.base import StreamingRule
from resfl_lightning.types import ClientReport


@dataclass
class SharpnessAware(StreamingRule):
    eps: float = 0.005
    needs_fim = True

    def __post_init__(self) -> None:
        if not self.eps > 0:
            raise ValueError(f"algorithm.curv_eps must be > 0, got {self.eps}")

    def score(self, report: ClientReport) -> float:
        if math.isnan(report.fim_eigenvalue):
            raise ValueError(f"client {report.client_id} reported no FIM eigenvalue; curvfed aggregation needs "
                             "algorithm.report_fim=true")
        return 1.0 / (report.eval_loss * max(report.fim_eigenvalue, 0.0) + self.eps)
