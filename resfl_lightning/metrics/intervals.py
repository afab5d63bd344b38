"""Intervals over seeds for the method comparison table: the Student-t interval of a mean (docs/method.md §11).

A method's value and its difference to the baseline (paired by seed) both get the t-interval mean ± t_{0.975,n-1}·s/√n.
The percentile bootstrap that was used for values never leaves the range of 3 seeds (coverage ≈ 75 % at n = 3), and
[min, max] is a "range", never a 95 % interval (docs/method.md §11).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
        if math.isnan(self.mean):
            return "n/a"
        if self.n < 2:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.std:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"

    @classmethod
    def of(cls, test: TTest) -> Interval:
        return cls(test.mean, test.sd, test.low, test.high, test.n, test.p)


def t_interval(values, confidence: float = 0.95) -> Interval:
    """Mean, std and the Student-t interval of the mean; None and NaN are dropped. Zero spread: [mean, mean]."""
    return Interval.of(t_test(list(values), confidence))


def paired_difference(values: SeedValues, baseline: SeedValues, confidence: float = 0.95) -> Interval:
    """Student-t interval of mean(values[s] - baseline[s]) over the seeds both have (paired by seed)."""
    return Interval.of(paired_t(values, baseline, confidence))
