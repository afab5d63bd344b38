"""The one-sided (non-inferiority) paired t-test and its power (metrics/statistics.py) against scipy and statsmodels."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import DescrStatsW

from resfl_lightning.metrics.statistics import noninferiority_t, one_sided_power, seeds_for_one_sided_power


@pytest.mark.parametrize("seed", range(4))
def test_noninferiority_bounds_and_p_match_statsmodels(seed):
    d = np.random.default_rng(seed).normal(0.003, 0.004, size=5)
    test = noninferiority_t(d, alpha=0.05)
    stats = DescrStatsW(d)
    low, high = stats.tconfint_mean(alpha=0.10)  # the two-sided 90 % interval = the one-sided 95 % bounds
    assert (test.low, test.high) == (pytest.approx(low), pytest.approx(high))
    assert test.p == pytest.approx(stats.ttest_mean(0.0, alternative="larger")[1])
    assert test.verdict == (True if low > 0 else (False if high < 0 else None))
    assert (test.p < 0.05) == (test.low > 0)  # the bound and the test agree


def test_noninferiority_verdicts_by_hand():
    # mean 0.01, sd sqrt(0.0008 / 3) = 0.01633, n 4: t_{0.95,3} = 2.35336, bound 0.01 - 2.35336 x 0.00816 = -0.0092
    holds = noninferiority_t([-0.01, 0.01, 0.03, 0.01])
    assert holds.low == pytest.approx(0.01 - 2.353363 * math.sqrt(0.0008 / 3) / 2, abs=1e-6)
    assert holds.high == pytest.approx(0.01 + 2.353363 * math.sqrt(0.0008 / 3) / 2, abs=1e-6)
    assert holds.verdict is None
    assert noninferiority_t([0.02, 0.021, 0.019, 0.02]).verdict is True
    assert noninferiority_t([-0.02, -0.021, -0.019, -0.02]).verdict is False
    assert noninferiority_t([0.5]).verdict is None and math.isnan(noninferiority_t([0.5]).low)
    flat = noninferiority_t([0.01, 0.01, 0.01])  # no spread: the point, p 0, where scipy gives NaN
    assert (flat.low, flat.high, flat.p, flat.verdict) == (0.01, 0.01, 0.0, True)
    with pytest.raises(ValueError, match="alpha"):
        noninferiority_t([0.1, 0.2], alpha=0.5)


def test_one_sided_power_and_seeds_match_statsmodels():
    solver = TTestPower()
    for d in (0.3, 0.8, 1.5, 2.5):
        n = seeds_for_one_sided_power(d)
        assert n == max(2, math.ceil(solver.solve_power(effect_size=d, alpha=0.05, power=0.8, alternative="larger")))
        assert one_sided_power(d, n) >= 0.8 and (n == 2 or one_sided_power(d, n - 1) < 0.8)
        assert one_sided_power(d, n) == pytest.approx(solver.power(effect_size=d, nobs=n, alpha=0.05,
                                                                   alternative="larger"))
    assert seeds_for_one_sided_power(0.5) == 27  # G*Power, one-tailed paired t, d_z 0.5, alpha 0.05, power 0.8
    assert seeds_for_one_sided_power(0.0) is None and seeds_for_one_sided_power(-1.0) is None
    assert seeds_for_one_sided_power(float("nan")) is None and seeds_for_one_sided_power(1e-15) is None
    assert math.isnan(one_sided_power(1.0, 1))
