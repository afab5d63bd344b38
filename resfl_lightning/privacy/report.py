"""What DP-SGD's client plug-in (privacy/dp.py ClientDP) reports in ClientReport.extras, and the run's DP numbers
reduced from it (callbacks/reports.py logs them and keeps them in the checkpoint)."""

from __future__ import annotations

import math

import numpy as np
import torch

from resfl_lightning.types import ClientReport

EPSILON_KEY = "dp_epsilon"  # ClientReport.extras: epsilon the client has spent so far over the run
STATISTICS_KEY = "dp_statistics"  # ClientReport.extras: its accounting numbers (ClientDP.statistics: z, q, steps, ...)
DP_MAX_KEY, DP_LATEST_PREFIX = "reports.dp_epsilon_max", "reports.dp_latest."  # ServerState.extra keys


def client_dp_metrics(report: ClientReport, prefix: str) -> dict[str, float]:
    """A client's DP numbers beside its report's own (ClientReport.as_log_dict logs <prefix>/dp_epsilon): NaN for
    dp_epsilon without DP-SGD, so every run logs the key, and <prefix>/dp_<key> of each accounting number."""
    out = {} if EPSILON_KEY in report.extras else {f"{prefix}/{EPSILON_KEY}": math.nan}
    out.update({f"{prefix}/dp_{k}": v for k, v in report.extras.get(STATISTICS_KEY, {}).items()})
    return out


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
