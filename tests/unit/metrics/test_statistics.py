"""Statistics over seeds (metrics/statistics.py) against statsmodels, scipy and hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower

from resfl_lightning.metrics.fate import fate
from resfl_lightning.metrics.statistics import (
    below_utility_floor,
    benjamini_hochberg,
    detectable_effect,
    fate_over_seeds,
    holm,
    majority_class_rate,
    noninferiority_t,
    paired_power,
    paired_t,
    relative_change,
    seeds_for_power,
    seeds_for_power_normal,
    t_test,
    verdict,
)


# --- t-tests -------------------------------------------------------------------------------------------------------
def test_t_interval_and_p_match_the_textbook_formula():
    d = [0.299, -0.113, -0.117]
    res = t_test(d)
    half = 4.302652729911275 * np.std(d, ddof=1) / math.sqrt(3)  # t_{0.975, 2} from tables
    assert (res.low, res.high) == pytest.approx((np.mean(d) - half, np.mean(d) + half))
    t = np.mean(d) / (np.std(d, ddof=1) / math.sqrt(3))
    assert res.p == pytest.approx(2 * (1 - _t_cdf_df2(abs(t))))
    assert res.n == 3 and not res.excludes_zero


def _t_cdf_df2(t: float) -> float:
    """Student t CDF with 2 degrees of freedom in closed form: 1/2 + t / (2 sqrt(2 + t²))."""
    return 0.5 + t / (2 * math.sqrt(2 + t * t))


def test_paired_t_uses_only_seeds_where_both_have_a_value():
    a = {0: 0.50, 1: 0.55, 2: None, 3: 0.61, 4: float("nan")}
    b = {0: 0.40, 1: 0.50, 2: 0.45, 3: 0.50, 4: 0.52, 5: 0.49}
    res = paired_t(a, b)
    assert res.n == 3 and res.mean == pytest.approx(np.mean([0.10, 0.05, 0.11]))  # seeds 0, 1, 3


def test_zero_spread_and_too_few_seeds():
    same = t_test([0.1, 0.1, 0.1])
    assert (same.low, same.high, same.sd, same.p) == pytest.approx((0.1, 0.1, 0.0, 0.0))
    assert t_test([0.0, 0.0]).p == 1.0
    one = t_test([0.3, None])
    assert one.n == 1 and math.isnan(one.p) and not one.testable


def test_differences_that_are_float_rounding_are_not_significant():
    # two runs equal but for the last bit of one seed (FairFed vs FedAvg's MIA balanced accuracy on the calibrated
    # preset table: 0.6000000000000001 vs 0.6): no spread and no effect, so nothing to reject
    noise = paired_t({0: 0.5380952380952381, 1: 0.5, 2: 0.6000000000000001}, {0: 0.5380952380952381, 1: 0.5, 2: 0.6})
    assert noise.p == 1.0 and noise.mean == 0.0 and not noise.excludes_zero
    assert t_test([1e-15, -1e-15, 0.0]).p == 1.0
    assert t_test([0.02, 0.02, 0.02]).p == 0.0  # an exact effect on every seed still is one
    # the non-inferiority test reads the same point: float noise above 0 is not a margin cleared
    assert noninferiority_t([0.0, 0.0, 1.1e-16]).p == 1.0 and noninferiority_t([0.0, 0.0, 1.1e-16]).low == 0.0
    assert noninferiority_t([0.02, 0.02, 0.02]).p == 0.0


# --- multiple comparisons ------------------------------------------------------------------------------------------
def test_holm_and_bh_hand_computed():
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 -> max(0.06, 0.04) = 0.06
    reject, adj = holm(p)
    assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02]) and reject.tolist() == [True, False, False, True]
    # BH: m p / j = 0.02, 0.02, 0.04, 0.04 for the sorted p; all at or below 0.05
    reject, q = benjamini_hochberg(p)
    assert q == pytest.approx([0.02, 0.04, 0.04, 0.02]) and reject.all()
    assert holm([])[0].size == 0 and benjamini_hochberg([])[1].size == 0


@pytest.mark.parametrize("seed", range(20))
def test_holm_and_bh_match_statsmodels(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 40))
    p = np.concatenate([rng.uniform(0, 0.02, m // 3), rng.uniform(0, 1, m - m // 3)])
    p[rng.integers(0, m)] = p[0]  # ties
    for ours, method in ((holm, "holm"), (benjamini_hochberg, "fdr_bh")):
        reject, adjusted = ours(p, alpha=0.05)
        ref_reject, ref_adjusted, _, _ = multipletests(p, alpha=0.05, method=method)
        assert reject.tolist() == ref_reject.tolist()
        assert adjusted == pytest.approx(ref_adjusted)


def test_bad_p_values_are_refused():
    with pytest.raises(ValueError, match="p-values"):
        holm([0.1, float("nan")])
    with pytest.raises(ValueError, match="p-values"):
        benjamini_hochberg([1.2])


# --- power ---------------------------------------------------------------------------------------------------------
def test_seeds_for_power_known_values_and_statsmodels():
    # docs/method.md §11: d_z = 1 -> 10 seeds, d_z = 0.5 -> 34 (G*Power gives the same for a two-sided paired t-test)
    assert seeds_for_power(1.0) == 10 and seeds_for_power(0.5) == 34 and seeds_for_power(-0.5) == 34
    assert seeds_for_power_normal(1.0) == pytest.approx(9.77, abs=0.01)
    assert seeds_for_power_normal(0.5) == pytest.approx(7.849 / 0.25 + 1.921, abs=0.01)
    solver = TTestPower()
    for d in (0.3, 0.8, 1.5, 2.5):
        n = seeds_for_power(d)
        assert n == max(2, math.ceil(solver.solve_power(effect_size=d, alpha=0.05, power=0.8)))
        assert paired_power(d, n) >= 0.8 > paired_power(d, n - 1) if n > 2 else True
        assert paired_power(d, n) == pytest.approx(solver.power(effect_size=d, nobs=n, alpha=0.05))
    assert seeds_for_power(0.0) is None and seeds_for_power(float("nan")) is None
    assert seeds_for_power(1e-15) is None  # more than max_n seeds: no number, not an overflow
    assert math.isinf(seeds_for_power_normal(0.0))


def test_detectable_effect_inverts_the_power_against_statsmodels():
    solver = TTestPower()
    for n in (3, 10, 34):
        d = detectable_effect(n)
        assert paired_power(d, n) == pytest.approx(0.8, abs=1e-8)
        assert d == pytest.approx(solver.solve_power(nobs=n, alpha=0.05, power=0.8), rel=1e-4)
    assert seeds_for_power(detectable_effect(10) * 1.001) == 10  # the effect that 10 seeds just resolve
    assert detectable_effect(3) > detectable_effect(10) > detectable_effect(34)
    assert math.isnan(detectable_effect(1))


# --- ratios and FATE -----------------------------------------------------------------------------------------------
def _delta_method_se(f, samples: np.ndarray) -> float:
    """SE of f(column means) by the delta method with a central-difference gradient and the sample covariance."""
    mu = samples.mean(axis=0)
    grad = np.zeros_like(mu)
    for i in range(mu.size):
        h = 1e-6 * max(1.0, abs(mu[i]))
        up, down = mu.copy(), mu.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    cov = np.cov(samples, rowvar=False, ddof=1)
    return float(math.sqrt(grad @ cov @ grad / samples.shape[0]))


def test_relative_change_interval_is_the_delta_method():
    rng = np.random.default_rng(3)
    b = rng.uniform(0.2, 0.3, 8)
    a = b * 0.85 + rng.normal(0, 0.01, 8)
    res = relative_change(dict(enumerate(a)), dict(enumerate(b)))
    assert res.value == pytest.approx(a.mean() / b.mean() - 1)
    assert res.se == pytest.approx(_delta_method_se(lambda m: m[0] / m[1] - 1, np.column_stack([a, b])), rel=1e-5)
    assert res.high - res.value == pytest.approx(2.3646242510102993 * res.se)  # t_{0.975, 7}


def test_fate_over_seeds_hand_computed_at_curvfeds_scale():
    u_f, u_b = {0: 0.84, 1: 0.86}, {0: 0.80, 1: 0.80}
    e_f, e_b = {0: 0.10, 1: 0.12}, {0: 0.20, 1: 0.20}
    # 10 * [(0.85 - 0.80)/0.80 + (0.20 - 0.11)/0.20] = 10 * (0.0625 + 0.45)
    assert fate_over_seeds(u_f, u_b, e_f, e_b).value == pytest.approx(5.125)
    assert fate_over_seeds(u_f, u_b, e_f, e_b, lambda_f=0.5).value == pytest.approx(10 * (0.0625 + 0.225))
    # one pair of runs: the same as the per-run formula
    assert fate_over_seeds({0: 0.85}, {0: 0.8}, {0: 0.05}, {0: 0.1}).value == pytest.approx(fate(0.85, 0.8, 0.05, 0.1))


def test_fate_is_a_ratio_of_means_not_a_mean_of_ratios():
    u_f, u_b = {0: 0.5, 1: 0.9}, {0: 0.4, 1: 0.9}
    e_f, e_b = {0: 0.1, 1: 0.1}, {0: 0.02, 1: 0.3}
    ratio = fate_over_seeds(u_f, u_b, e_f, e_b).value
    assert ratio == pytest.approx(10 * ((0.7 - 0.65) / 0.65 + (0.16 - 0.1) / 0.16))
    per_seed = np.mean([fate(u_f[s], u_b[s], e_f[s], e_b[s]) for s in (0, 1)])
    assert abs(ratio - per_seed) > 1  # the per-seed mean is dominated by seed 0's tiny EO_b


def test_fate_interval_se_is_the_delta_method_of_its_four_means():
    rng = np.random.default_rng(7)
    n = 6
    u_b = rng.uniform(0.78, 0.82, n)
    u_f = u_b + rng.normal(-0.01, 0.01, n)
    e_b = rng.uniform(0.15, 0.25, n)
    e_f = e_b * 0.7 + rng.normal(0, 0.02, n)
    res = fate_over_seeds(*(dict(enumerate(v)) for v in (u_f, u_b, e_f, e_b)), lambda_f=1.0)

    def f(m):
        return 10 * ((m[0] - m[1]) / m[1] + (m[3] - m[2]) / m[3])

    assert res.se == pytest.approx(_delta_method_se(f, np.column_stack([u_f, u_b, e_f, e_b])), rel=1e-5)
    assert res.n == n and res.low < res.value < res.high


def test_fate_undefined_when_the_baselines_mean_eo_is_zero():
    res = fate_over_seeds({0: 0.8, 1: 0.8}, {0: 0.8, 1: 0.8}, {0: 0.1, 1: 0.1}, {0: 0.0, 1: 0.0})
    assert math.isnan(res.value) and res.n == 2
    assert fate_over_seeds({0: 0.8}, {1: 0.8}, {0: 0.1}, {1: 0.1}).n == 0  # no common seed


# --- verdicts ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("low", "high", "paper", "expected"), [
    (-0.10, -0.02, None, "reproduced"),
    (-0.10, 0.02, None, "not detected"),
    (0.01, 0.05, None, "refuted"),  # the other side of 0
    (-0.10, -0.02, -0.05, "reproduced"),  # holds the paper's effect
    (-0.30, -0.10, -0.05, "reproduced"),  # larger than the paper's effect
    (-0.04, -0.01, -0.05, "direction reproduced, magnitude refuted"),
    (-0.10, 0.02, -0.05, "not detected"),
    (-0.03, 0.02, -0.05, "refuted"),  # holds 0, excludes the paper's effect
    (0.01, 0.05, -0.05, "refuted"),
])
def test_verdicts_follow_spec_section_11(low, high, paper, expected):
    assert verdict(low, high, 5, paper, -1) == expected
    # the mirror image for a claimed increase
    assert verdict(-high, -low, 5, None if paper is None else -paper, 1) == expected


def test_verdict_needs_two_seeds_and_a_consistent_claim():
    assert verdict(float("nan"), float("nan"), 1, None, -1) == "not testable"
    with pytest.raises(ValueError, match="direction"):
        verdict(-0.1, 0.1, 3, 0.05, -1)


# --- utility floor -------------------------------------------------------------------------------------------------
def test_utility_floor():
    assert majority_class_rate([0, 1, 1, 1]) == 0.75
    with pytest.raises(ValueError, match="no labels"):
        majority_class_rate([])
    assert below_utility_floor({"test/map_50": 0.049}) == "mAP@50 0.049 < 0.05"
    assert below_utility_floor({"test/map_50": 0.05}) is None
    assert "majority" in below_utility_floor({"test/accuracy": 0.75, "test/majority_class_rate": 0.75})
    assert below_utility_floor({"test/accuracy": 0.76, "test/majority_class_rate": 0.75}) is None
    assert below_utility_floor({"test/accuracy": 0.76}) is None  # no majority rate recorded: not judged
    # resfl tune judges the validation split (never the test split's values)
    val = {"val/accuracy": 0.75, "val/majority_class_rate": 0.75, "test/accuracy": 0.9, "test/majority_class_rate": 0.5}
    assert below_utility_floor(val, split="val") == "val accuracy 0.750 <= majority-class rate 0.750"
    assert below_utility_floor(val) is None
    assert below_utility_floor({"val/map_50": 0.01, "test/map_50": 0.5}, 0.05, "val") == "val mAP@50 0.010 < 0.05"


def test_no_positive_at_threshold_only_when_every_group_rate_is_zero():
    from resfl_lightning.metrics.statistics import no_positive_at_threshold

    zero = {"test/tpr/0": 0.0, "test/tpr/1": 0.0, "test/tpr/2": 0.0, "test/delta_eop": 0.0}
    assert no_positive_at_threshold(zero) == (
        "test TPR 0 in all 3 groups: nothing detected or predicted positive at the threshold")
    assert no_positive_at_threshold({**zero, "test/tpr/2": 0.01}) is None  # one group served: rates compare
    assert no_positive_at_threshold({"test/map_50": 0.7}) is None  # no group rates: not judged
    assert no_positive_at_threshold({"test/tpr/0": None, "test/tpr/1": 0.0}) is not None  # undefined ones skipped
    assert no_positive_at_threshold({**zero, "val/tpr/0": 0.5}, split="val") is None
