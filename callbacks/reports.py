"""Per-client UFM, gate status, aggregation weight and mean losses every round, and the UFM mechanism check."""

from __future__ import annotations

import math

from resfl_lightning.metrics.mechanism import ufm_fairness_correlation


class ClientReportLogger:
    def __init__(self) -> None:
        self.dp_epsilon_max = 0.0  # DP-SGD: the largest epsilon any client has spent so far

    def on_round_end(self, reports, weights: dict[int, float], metrics: dict) -> None:
        for r in reports:
            metrics.update(r.as_log_dict(f"client/{r.client_id}"))
            metrics[f"client/{r.client_id}/weight"] = weights[r.client_id]
        n = max(len(reports), 1)
        metrics["clients/mean_u"] = sum(r.u for r in reports) / n
        raw = [r.ufm_raw for r in reports if math.isfinite(r.ufm_raw)]  # NaN: fewer than two usable groups
        metrics["clients/mean_ufm_raw"] = sum(raw) / len(raw) if raw else math.nan
        metrics["clients/insufficient_groups"] = float(len(reports) - len(raw))
        metrics["mechanism/spearman_ufm_val_delta_eop"] = ufm_fairness_correlation(
            [r.ufm_raw for r in reports], [r.val_delta_eop for r in reports])
        metrics["clients/gated_fraction"] = sum(r.gated for r in reports) / n
        metrics["clients/mean_val_utility"] = sum(r.val_utility for r in reports) / n
        metrics["clients/max_weight"] = max(weights.values()) if weights else 0.0
        spent = [r.dp_epsilon for r in reports if r.dp_epsilon == r.dp_epsilon]  # DP-SGD runs only (NaN otherwise)
        if spent:
            self.dp_epsilon_max = max(self.dp_epsilon_max, *spent)  # over every client seen
            metrics["dp/epsilon_max"] = self.dp_epsilon_max
        for key in sorted({k for r in reports for k in r.train_losses}):
            vals = [r.train_losses[key] for r in reports if key in r.train_losses]
            metrics[f"train/{key}"] = sum(vals) / len(vals)
