"""Mechanism check for UFM weighting: does a client's UFM rank clients the way their validation ΔEOP does?"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def ufm_fairness_correlation(ufm: Sequence[float], delta_eop: Sequence[float]) -> float:
    """Spearman correlation between per-client UFM and per-client validation ΔEOP over clients where both are
    finite; NaN with fewer than 3 such clients or a constant column (the rank correlation is undefined)."""
    pairs = [(float(u), float(e)) for u, e in zip(ufm, delta_eop) if math.isfinite(u) and math.isfinite(e)]
    if len(pairs) < 3:
        return math.nan
    u, e = np.array(pairs).T
    if np.all(u == u[0]) or np.all(e == e[0]):
        return math.nan
    return float(stats.spearmanr(u, e).statistic)
