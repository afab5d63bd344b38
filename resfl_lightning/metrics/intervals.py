"""Intervals over seeds for the method comparison table: the Student-t interval of a mean (docs/method.md §11).

A method's value and its difference to the baseline (paired by seed) both get the t-interval mean ± t_{0.975,n-1}·s/√n.
The percentile bootstrap that was used for values never leaves the range of 3 seeds (coverage ≈ 75 % at n = 3), and
[min, max] is a "range", never a 95 % interval (docs/method.md §11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from resfl_lightning.metrics.statistics import SeedValues, TTest, paired_t, t_test


@dataclass(frozen=True)
class Interval:
    mean: float
    std: float  # sample standard deviation over seeds (ddof=1; NaN for one seed)
    low: float  # 95 % Student-t interval of the mean (NaN for fewer than 2 seeds)
    high: float
    n: int
    p: float = math.nan  # two-sided t-test against 0

    @property
    def excludes_zero(self) -> bool:
        return self.n >= 2 and (self.low > 0 or self.high < 0)

    def fmt(self, digits: int = 3) -> str:
        return interval_text(self, digits, sd=True)

    @classmethod
    def of(cls, test: TTest) -> Interval:
        return cls(test.mean, test.sd, test.low, test.high, test.n, test.p)


def interval_text(t: TTest | Interval, digits: int = 3, signed: bool = False, sd: bool = False,
                  point_alone: bool = True) -> str:
    """The one way a mean and its interval are written: `mean [low, high]` (`mean ± sd [low, high]` with sd; a sign
    with signed); with fewer than 2 values the mean alone (n/a when not point_alone); n/a without a value."""
    if t.n == 0 or math.isnan(t.mean):
        return "n/a"
    num = f"{{:{'+' if signed else ''}.{digits}f}}".format
    if t.n < 2:
        return num(t.mean) if point_alone else "n/a"
    spread = f" ± {(t.std if isinstance(t, Interval) else t.sd):.{digits}f}" if sd else ""
    return f"{num(t.mean)}{spread} [{num(t.low)}, {num(t.high)}]"


def mean_sd_text(values, digits: int = 3) -> str:
    """`mean ± sd` (ddof=1) of the finite values, the mean alone for one, n/a for none: a spread over seeds without
    an interval (the tables' descriptive sections)."""
    x = np.array([v for v in values if v is not None], dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return "n/a"
    if x.size == 1:
        return f"{x.mean():.{digits}f}"
    return f"{x.mean():.{digits}f} ± {x.std(ddof=1):.{digits}f}"


def t_interval(values, confidence: float = 0.95) -> Interval:
    """Mean, std and the Student-t interval of the mean; None and NaN are dropped. Zero spread: [mean, mean]."""
    return Interval.of(t_test(list(values), confidence))


def paired_difference(values: SeedValues, baseline: SeedValues, confidence: float = 0.95) -> Interval:
    """Student-t interval of mean(values[s] - baseline[s]) over the seeds both have (paired by seed)."""
    return Interval.of(paired_t(values, baseline, confidence))
