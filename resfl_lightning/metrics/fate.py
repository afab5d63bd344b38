"""FATE (CurvFed Eq. 2, docs/method.md §6) at the 10x scale CurvFed prints: accuracy gain plus weighted EO-gap
reduction, both relative to a FedAvg baseline. Over seeds the table takes it as a ratio of means
(metrics/statistics.py::fate_over_seeds); this is one pair of runs."""

from __future__ import annotations

import math

from resfl_lightning.metrics.statistics import FATE_SCALE

__all__ = ["FATE_SCALE", "fate"]


def fate(acc_f: float, acc_b: float, eo_f: float, eo_b: float, lambda_f: float = 1.0) -> float:
    """FATE = 10·[(ACC_f - ACC_b)/ACC_b + lambda_F (EO_b - EO_f)/EO_b]; higher is better.

    _f is the fair method, _b the FedAvg baseline on the same seed and data.
    """
    for name, val in (("acc_f", acc_f), ("acc_b", acc_b), ("eo_f", eo_f), ("eo_b", eo_b), ("lambda_f", lambda_f)):
        if not math.isfinite(val):
            raise ValueError(f"{name} must be finite, got {val}")
    for name, val in (("acc_f", acc_f), ("acc_b", acc_b), ("eo_f", eo_f), ("eo_b", eo_b)):
        if not 0.0 <= val <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {val}")
    if acc_b == 0:
        raise ValueError("acc_b (baseline accuracy) is 0: FATE's relative accuracy gain is undefined")
    if eo_b == 0:
        raise ValueError("eo_b (baseline EO gap) is 0: FATE's relative EO reduction is undefined")
    return FATE_SCALE * ((acc_f - acc_b) / acc_b + lambda_f * (eo_b - eo_f) / eo_b)
