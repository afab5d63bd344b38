"""Intervals over seeds for the method comparison table.

A method's value: percentile-bootstrap interval of its mean. Its difference to the baseline, paired by seed: Student-t
interval of the mean difference. With 3 seeds the percentile bootstrap never leaves the range of the 3 differences, so
it would call every same-sign triple a difference; the t-interval widens with few seeds as it should.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Interval:
    mean: float
    std: float  # sample standard deviation over seeds (ddof=1; NaN for one seed)
    low: float  # 95% interval of the mean (bootstrap for a value, Student-t for a paired difference)
    high: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        return self.n >= 2 and (self.low > 0 or self.high < 0)

    def fmt(self, digits: int = 3) -> str:
        if math.isnan(self.mean):
            return "n/a"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def _finite(values) -> np.ndarray:
    """The values as a float array, None and NaN dropped."""
    return np.asarray([v for v in values if v is not None and not math.isnan(float(v))], dtype=float)


def bootstrap_interval(values, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Interval:
    """Mean, std and the percentile-bootstrap interval of the mean (scipy.stats.bootstrap); NaNs are dropped."""
    x = _finite(values)
    if x.size == 0:
        return Interval(math.nan, math.nan, math.nan, math.nan, 0)
    mean, std = float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else math.nan
    if x.size == 1 or np.all(x == x[0]):
        return Interval(mean, std if x.size > 1 else math.nan, mean if x.size > 1 else math.nan,
                        mean if x.size > 1 else math.nan, int(x.size))
    res = stats.bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=resamples, method="percentile",
                          random_state=np.random.default_rng(seed))
    return Interval(mean, std, float(res.confidence_interval.low), float(res.confidence_interval.high), int(x.size))


def t_interval(values, confidence: float = 0.95) -> Interval:
    """Mean, std and the Student-t interval of the mean (scipy.stats.ttest_1samp); NaNs are dropped.

    Zero spread gives the point interval [mean, mean]: a difference that is the same on every seed.
    """
    x = _finite(values)
    if x.size < 2:
        return Interval(float(x.mean()) if x.size else math.nan, math.nan, math.nan, math.nan, int(x.size))
    mean, std = float(x.mean()), float(x.std(ddof=1))
    if std <= 1e-12 * max(1.0, abs(mean)):  # float noise of identical differences
        return Interval(mean, 0.0, mean, mean, int(x.size))
    ci = stats.ttest_1samp(x, 0.0).confidence_interval(confidence)
    return Interval(mean, std, float(ci.low), float(ci.high), int(x.size))


def paired_difference(values: dict[int, float], baseline: dict[int, float], confidence: float = 0.95) -> Interval:
    """Student-t interval of mean(values[s] - baseline[s]) over the seeds both have (paired by seed)."""
    seeds = sorted(s for s in values if s in baseline and values[s] is not None and baseline[s] is not None)
    return t_interval([values[s] - baseline[s] for s in seeds], confidence)
