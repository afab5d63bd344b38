"""Per-client UFM, gate status, aggregation weight and mean losses every round, and the UFM mechanism check."""

from __future__ import annotations

import math

import numpy as np
import torch

from resfl_lightning.metrics.mechanism import ufm_fairness_correlation


def dp_run_metrics(latest: dict[int, dict[str, float]]) -> dict[str, float]:
    """The run's DP-SGD numbers from each client's latest statistics: steps S_k = the most any client took, PUFFLE's
    spent epsilon parts (epsilon_sgd, epsilon_stat, epsilon_lambda), lambda updates and count releases the most of
    any client, every other number (z, q, B, C, epsilon target, delta, NSR) the median over the clients (equal for
    IID equal-size clients; the NSR is each client's median over its steps)."""
    keys = sorted({k for stats in latest.values() for k in stats})
    out: dict[str, float] = {}
    for key in keys:
        values = np.asarray([stats[key] for stats in latest.values() if key in stats], dtype=np.float64)
        most = key in ("steps", "lambda_updates", "stat_releases") or key.startswith("epsilon_")
        reduce = np.max if most else np.median
        out[f"dp/{key}"] = float(reduce(values))  # NaN (a fixed z has no epsilon target) stays NaN
    return out


DP_MAX_KEY, DP_LATEST_PREFIX = "reports.dp_epsilon_max", "reports.dp_latest."  # ServerState.extra keys


def dp_state(epsilon_max: float, latest: dict[int, dict[str, float]]) -> dict[str, torch.Tensor]:
    """The DP numbers over every client seen so far as checkpoint tensors: one (clients, 2) [client, value] table a
    statistic (a client that lacks it has no row)."""
    out = {DP_MAX_KEY: torch.tensor(epsilon_max, dtype=torch.float64)}
    for key in sorted({k for stats in latest.values() for k in stats}):
        rows = [[cid, stats[key]] for cid, stats in sorted(latest.items()) if key in stats]
        out[DP_LATEST_PREFIX + key] = torch.tensor(rows, dtype=torch.float64).reshape(-1, 2)
    return out


def dp_from_state(extra: dict[str, torch.Tensor]) -> tuple[float, dict[int, dict[str, float]]]:
    """The inverse of `dp_state` ((0, {}) when the checkpoint holds none)."""
    latest: dict[int, dict[str, float]] = {}
    for name, table in extra.items():
        if name.startswith(DP_LATEST_PREFIX):
            for cid, value in table.tolist():
                latest.setdefault(int(cid), {})[name[len(DP_LATEST_PREFIX):]] = float(value)
    return float(extra.get(DP_MAX_KEY, torch.tensor(0.0))), latest


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
        spent = [r.dp_epsilon for r in reports if r.dp_epsilon == r.dp_epsilon]  # DP-SGD runs only (NaN otherwise)
        if spent:
            self.dp_epsilon_max = max(self.dp_epsilon_max, *spent)  # over every client seen
            metrics["dp/epsilon_max"] = self.dp_epsilon_max
        self.dp_latest.update({r.client_id: r.dp_statistics for r in reports if r.dp_statistics})
        if self.dp_latest:
            metrics.update(dp_run_metrics(self.dp_latest))
        if state is not None and (spent or self.dp_latest):  # in place: the orchestrator checkpoints it next
            state.extra.update(dp_state(self.dp_epsilon_max, self.dp_latest))
        for key in sorted({k for r in reports for k in r.train_losses}):
            vals = [r.train_losses[key] for r in reports if key in r.train_losses]
            metrics[f"train/{key}"] = sum(vals) / len(vals)
