"""FedAvg: omega_i = n_i / sum_j n_j."""

from __future__ import annotations

import math
from dataclasses import dataclass

from resfl_lightning.aggregation.base import StreamingRule
from resfl_lightning.types import ClientReport


@dataclass
class FedAvg(StreamingRule):
    uses_client_evaluation = False  # sample counts only

    def score(self, report: ClientReport) -> float:
        if report.num_samples <= 0:
            raise ValueError(f"client {report.client_id} reported num_samples={report.num_samples}")
        return math.log(report.num_samples)
