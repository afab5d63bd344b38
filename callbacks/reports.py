"""Per-client UFM, gate status, aggregation weight and mean losses every round, and the UFM mechanism check."""

from __future__ import annotations

import math

from resfl_lightning.metrics.mechanism import ufm_fairness_correlation
from resfl_lightning.privacy.report import (
    EPSILON_KEY,
    STATISTICS_KEY,
    client_dp_metrics,
    dp_from_state,
    dp_run_metrics,
    dp_state,
)


class ClientReportLogger:
    """Per-client metrics of each round, and the DP-SGD numbers over every client seen so far (kept in the checkpoint's
    ServerState.extra, so a resumed run with partial participation still counts the clients of earlier rounds)."""

    def __init__(self) -> None:
        self.dp_epsilon_max = 0.0  # DP-SGD: the largest epsilon any client has spent so far
        self.dp_latest: dict[int, dict[str, float]] = {}  # DP-SGD: client -> its latest accounting numbers

    def on_fit_start(self, state) -> None:
        self.dp_epsilon_max, self.dp_latest = dp_from_state(state.extra)

    def on_round_end(self, reports, weights: dict[int, float], metrics: dict, state=None) -> None:
        # federation.client_validation=when_used: a client that skipped its validation reports NaN evaluation
        # fields (a validated one always has a finite val_utility); the client means are over validated clients.
        validated = [r for r in reports if math.isfinite(r.val_utility)]
        for r in reports:
            metrics.update(r.as_log_dict(f"client/{r.client_id}"))
            metrics.update(client_dp_metrics(r, f"client/{r.client_id}"))
            metrics[f"client/{r.client_id}/weight"] = weights[r.client_id]
            if not math.isfinite(r.val_utility):
                metrics[f"client/{r.client_id}/gated"] = math.nan  # not measured, not "not gated"
        none = bool(reports) and not validated
        n = math.nan if none else max(len(validated), 1)
        metrics["clients/mean_u"] = sum(r.u for r in validated) / n
        raw = [r.ufm_raw for r in validated if math.isfinite(r.ufm_raw)]  # NaN: fewer than two usable groups
        metrics["clients/mean_ufm_raw"] = sum(raw) / len(raw) if raw else math.nan
        metrics["clients/insufficient_groups"] = math.nan if none else float(len(validated) - len(raw))
        metrics["mechanism/spearman_ufm_val_delta_eop"] = ufm_fairness_correlation(
            [r.ufm_raw for r in validated], [r.val_delta_eop for r in validated])
        metrics["clients/gated_fraction"] = sum(r.gated for r in validated) / n
        metrics["clients/mean_val_utility"] = sum(r.val_utility for r in validated) / n
        metrics["clients/max_weight"] = max(weights.values()) if weights else 0.0
        spent = [e for e in (r.extras.get(EPSILON_KEY, math.nan) for r in reports) if e == e]  # DP-SGD runs only
        if spent:
            self.dp_epsilon_max = max(self.dp_epsilon_max, *spent)  # over every client seen
            metrics["dp/epsilon_max"] = self.dp_epsilon_max
        self.dp_latest.update({r.client_id: r.extras[STATISTICS_KEY] for r in reports
                               if r.extras.get(STATISTICS_KEY)})
        if self.dp_latest:
            metrics.update(dp_run_metrics(self.dp_latest))
        if state is not None and (spent or self.dp_latest):  # in place: the orchestrator checkpoints it next
            state.extra.update(dp_state(self.dp_epsilon_max, self.dp_latest))
        for key in sorted({k for r in reports for k in r.train_losses}):
            vals = [r.train_losses[key] for r in reports if key in r.train_losses]
            metrics[f"train/{key}"] = sum(vals) / len(vals)
