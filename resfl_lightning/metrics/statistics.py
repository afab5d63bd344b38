"""Statistics for comparisons over seeds (docs/method.md §11): paired t-tests, Holm and Benjamini-Hochberg
corrections, seeds needed for a given power, delta-method intervals of ratios of means, FATE over seeds, verdicts
against a paper's effect, and the utility floor below which a run "did not learn".

Pure functions of per-seed values (dicts seed -> value; None or NaN = no value). scipy does the t and noncentral-t
distributions; resfl_lightning/analysis/table.py decides which comparisons form a family.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from resfl_lightning.values import finite

SeedValues = Mapping[int, "float | None"]


def common_seeds(*series: SeedValues) -> list[int]:
    """Seeds where every series has a finite value, sorted."""
    seeds = set(series[0])
    for s in series[1:]:
        seeds &= set(s)
    return sorted(k for k in seeds if all(finite(s[k]) is not None for s in series))


@dataclass(frozen=True)
class TTest:
    """Mean of per-seed values (or paired differences) with its Student-t interval and two-sided p against 0."""

    mean: float
    sd: float  # sample standard deviation (ddof=1); NaN for n < 2
    low: float
    high: float
    n: int
    p: float  # NaN when n < 2

    @property
    def testable(self) -> bool:
        return self.n >= 2 and not math.isnan(self.p)

    @property
    def excludes_zero(self) -> bool:
        return self.n >= 2 and (self.low > 0 or self.high < 0)


def _point_mass(mean: float, sd: float) -> float | None:
    """The values' common value when their spread is float noise (0 when the mean is within that noise of 0: two runs
    equal but for a last bit), else None: the t statistic is infinite or undefined there, and scipy returns NaN."""
    noise = 1e-12 * max(1.0, abs(mean))
    if sd > noise:
        return None
    return mean if abs(mean) > noise else 0.0


def t_test(values: Sequence[float], confidence: float = 0.95) -> TTest:
    """Mean ± t_{(1+c)/2, n-1}·s/√n and the one-sample t-test against 0 (scipy.stats.ttest_1samp).

    Zero spread (float noise of identical values) gives the point interval and p = 0 (mean ≠ 0) or 1 (mean = 0): the
    t statistic is infinite or undefined there (`_point_mass`).
    """
    x = np.asarray([float(v) for v in values if finite(v) is not None], dtype=float)
    n = int(x.size)
    if n < 2:
        mean = float(x.mean()) if n else math.nan
        return TTest(mean, math.nan, math.nan, math.nan, n, math.nan)
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    if (point := _point_mass(mean, sd)) is not None:
        return TTest(point, 0.0, point, point, n, 0.0 if point != 0 else 1.0)
    res = stats.ttest_1samp(x, 0.0)
    ci = res.confidence_interval(confidence)
    return TTest(mean, sd, float(ci.low), float(ci.high), n, float(res.pvalue))


def paired_t(a: SeedValues, b: SeedValues, confidence: float = 0.95) -> TTest:
    """Paired t-test of a - b over the seeds where both are finite (docs/method.md §11)."""
    return t_test([float(a[s]) - float(b[s]) for s in common_seeds(a, b)], confidence)


def _check_p(pvalues: Sequence[float]) -> np.ndarray:
    p = np.asarray(pvalues, dtype=float)
    if p.ndim != 1 or np.any(np.isnan(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p-values must be a 1-d sequence in [0, 1] without NaN, got {list(pvalues)}")
    return p


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Holm step-down: (reject, adjusted p), adjusted p_(i) = max_{j<=i} min(1, (m-j+1) p_(j)), in input order."""
    p = _check_p(pvalues)
    m = p.size
    if m == 0:
        return np.zeros(0, bool), np.zeros(0)
    order = np.argsort(p, kind="stable")
    adjusted_sorted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return adjusted <= alpha, adjusted


def benjamini_hochberg(pvalues: Sequence[float], alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Benjamini-Hochberg: (reject, q), q_(i) = min_{j>=i} min(1, m p_(j) / j), in input order."""
    p = _check_p(pvalues)
    m = p.size
    if m == 0:
        return np.zeros(0, bool), np.zeros(0)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, m * p[order] / np.arange(1, m + 1))
    q_sorted = np.minimum.accumulate(scaled[::-1])[::-1]
    q = np.empty(m)
    q[order] = q_sorted
    return q <= alpha, q


def paired_power(d_z: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test with n seeds at standardised effect d_z (noncentral t, scipy.stats.nct)."""
    if n < 2:
        return math.nan
    df, nc = n - 1, abs(d_z) * math.sqrt(n)
    crit = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def seeds_for_power(d_z: float, power: float = 0.8, alpha: float = 0.05, max_n: int = 100_000) -> int | None:
    """Smallest n >= 2 whose paired t-test reaches `power` at effect d_z (exact, noncentral t); None when d_z is 0 or
    undefined, or more than max_n seeds would be needed."""
    if finite(d_z) is None or d_z == 0:
        return None
    if not 0 < power < 1 or not 0 < alpha < 1:
        raise ValueError(f"power and alpha must lie in (0, 1), got {power}, {alpha}")
    return _smallest_n(lambda n: paired_power(d_z, n, alpha), seeds_for_power_normal(d_z, power, alpha), power,
                       max_n)


def _smallest_n(power_of: Callable[[int], float], approx: float, power: float, max_n: int) -> int | None:
    """The smallest n >= 2 with power_of(n) >= power, searched from a normal approximation `approx` (close: within a
    seed or two); None beyond max_n."""
    if approx > max_n:
        return None
    n = max(2, int(approx) - 3)
    while n > 2 and power_of(n - 1) >= power:
        n -= 1
    while power_of(n) < power:
        n += 1
        if n > max_n:
            return None
    return n


def seeds_for_power_normal(d_z: float, power: float = 0.8, alpha: float = 0.05) -> float:
    """Normal approximation n ≈ (z_{1-α/2} + z_power)²/d_z² + z_{1-α/2}²/2.

    docs/method.md §11: 7.85/d_z² + 1.92 at 80 % power and α = 5 %."""
    if finite(d_z) is None or d_z == 0:
        return math.inf
    za, zb = stats.norm.ppf(1 - alpha / 2), stats.norm.ppf(power)
    return float((za + zb) ** 2 / d_z ** 2 + za ** 2 / 2)


def detectable_effect(n: int, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest standardised effect d_z a two-sided paired t-test with n seeds detects with `power` (the inverse
    of seeds_for_power at fixed n; NaN below 2 seeds)."""
    if n < 2:
        return math.nan
    if not 0 < power < 1 or not 0 < alpha < 1:
        raise ValueError(f"power and alpha must lie in (0, 1), got {power}, {alpha}")
    high = 1.0
    while paired_power(high, n, alpha) < power:  # bracket the root: power grows with d_z
        high *= 2
    return float(optimize.brentq(lambda d: paired_power(d, n, alpha) - power, 0.0, high, xtol=1e-10))



@dataclass(frozen=True)
class NonInferiority:
    """One-sided t-test of mean(d) > 0 over seeds (a non-inferiority test when d is the difference to the margin).
    low / high are the one-sided (1 - alpha) bounds, together the two-sided (1 - 2 alpha) interval of TOST."""

    mean: float
    sd: float  # ddof=1; NaN for n < 2
    low: float
    high: float
    n: int
    p: float  # one-sided, H1: mean > 0; NaN for n < 2
    alpha: float

    @property
    def verdict(self) -> bool | None:
        """True: the lower bound is above 0 (non-inferior at alpha); False: the upper bound is below 0 (inferior at
        alpha); None: the interval holds 0, or fewer than 2 seeds."""
        if self.n < 2:
            return None
        return True if self.low > 0 else (False if self.high < 0 else None)


def noninferiority_t(values: Sequence[float], alpha: float = 0.05) -> NonInferiority:
    """scipy.stats.ttest_1samp with alternative='greater' (and 'less' for the upper bound) at level alpha; zero spread
    gives the point as both bounds and p = 0 (mean > 0) or 1, where scipy would return NaN."""
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha}")
    x = np.asarray([float(v) for v in values if finite(v) is not None], dtype=float)
    n = int(x.size)
    if n < 2:
        mean = float(x.mean()) if n else math.nan
        return NonInferiority(mean, math.nan, math.nan, math.nan, n, math.nan, alpha)
    mean, sd = float(x.mean()), float(x.std(ddof=1))
    if (point := _point_mass(mean, sd)) is not None:
        return NonInferiority(point, 0.0, point, point, n, 0.0 if point > 0 else 1.0, alpha)
    greater = stats.ttest_1samp(x, 0.0, alternative="greater")
    less = stats.ttest_1samp(x, 0.0, alternative="less")
    return NonInferiority(mean, sd, float(greater.confidence_interval(1 - alpha).low),
                          float(less.confidence_interval(1 - alpha).high), n, float(greater.pvalue), alpha)


def one_sided_power(d_z: float, n: int, alpha: float = 0.05) -> float:
    """Power of the one-sided paired t-test (H1: mean > 0) with n seeds at standardised effect d_z (noncentral t)."""
    if n < 2:
        return math.nan
    df = n - 1
    return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, d_z * math.sqrt(n)))


def seeds_for_one_sided_power(d_z: float, power: float = 0.8, alpha: float = 0.05, max_n: int = 100_000) -> int | None:
    """Smallest n >= 2 whose one-sided paired t-test reaches `power` at effect d_z > 0; None when d_z <= 0 or
    undefined, or more than max_n seeds would be needed."""
    if finite(d_z) is None or d_z <= 0:
        return None
    if not 0 < power < 1 or not 0 < alpha < 1:
        raise ValueError(f"power and alpha must lie in (0, 1), got {power}, {alpha}")
    approx = (stats.norm.ppf(1 - alpha) + stats.norm.ppf(power)) ** 2 / d_z ** 2  # below the exact n
    return _smallest_n(lambda n: one_sided_power(d_z, n, alpha), approx, power, max_n)

@dataclass(frozen=True)
class RatioInterval:
    """A ratio-of-means statistic over common seeds with its delta-method standard error and Student-t interval."""

    value: float
    se: float
    low: float
    high: float
    n: int

    @property
    def excludes_zero(self) -> bool:
        return self.n >= 2 and (self.low > 0 or self.high < 0)


def _linearised_interval(value: float, influence: np.ndarray, confidence: float) -> RatioInterval:
    n = int(influence.size)
    if n < 2:
        return RatioInterval(value, math.nan, math.nan, math.nan, n)
    se = float(influence.std(ddof=1) / math.sqrt(n))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * se
    return RatioInterval(value, se, value - half, value + half, n)


def relative_change(a: SeedValues, b: SeedValues, confidence: float = 0.95) -> RatioInterval:
    """R = mean(a)/mean(b) - 1 over common seeds; SE = sd(L)/√n, L_s = (a_s - (R+1) b_s)/mean(b).

    Delta method, docs/method.md §11."""
    seeds = common_seeds(a, b)
    x = np.array([float(a[s]) for s in seeds])
    y = np.array([float(b[s]) for s in seeds])
    if not seeds or y.mean() == 0:
        return RatioInterval(math.nan, math.nan, math.nan, math.nan, len(seeds))
    r = x.mean() / y.mean() - 1.0
    return _linearised_interval(float(r), (x - (r + 1.0) * y) / y.mean(), confidence)


FATE_SCALE = 10.0  # CurvFed prints FATE at 10x its Eq. 2 (12 rows of its Table 18 reproduce; docs/method.md §6)


def fate_over_seeds(u_f: SeedValues, u_b: SeedValues, e_f: SeedValues, e_b: SeedValues, lambda_f: float = 1.0,
                    confidence: float = 0.95) -> RatioInterval:
    """FATE = 10·[(Ū_f - Ū_b)/Ū_b + λ_F (Ē_b - Ē_f)/Ē_b] over the seeds where all four are finite, with the
    delta-method interval of docs/method.md §11; NaN when Ū_b or Ē_b is 0 (the ratios are undefined)."""
    seeds = common_seeds(u_f, u_b, e_f, e_b)
    uf, ub, ef, eb = (np.array([float(v[s]) for s in seeds]) for v in (u_f, u_b, e_f, e_b))
    if not seeds or ub.mean() == 0 or eb.mean() == 0:
        return RatioInterval(math.nan, math.nan, math.nan, math.nan, len(seeds))
    r_u, r_e = uf.mean() / ub.mean(), ef.mean() / eb.mean()
    value = FATE_SCALE * ((r_u - 1.0) + lambda_f * (1.0 - r_e))
    influence = FATE_SCALE * ((uf - r_u * ub) / ub.mean() - lambda_f * (ef - r_e * eb) / eb.mean())
    return _linearised_interval(float(value), influence, confidence)


def verdict(low: float, high: float, n: int, paper_effect: float | None, direction: int) -> str:
    """docs/method.md §11's verdict for a claim, from the CI [low, high] of our effect on the paper's scale.

    direction: the sign the paper claims (-1 lower, +1 higher); paper_effect: the paper's effect Δ_p, or None when
    the paper gives only a direction. Returns reproduced / not detected / refuted / direction reproduced, magnitude
    refuted / not testable.
    """
    if direction not in (-1, 1):
        raise ValueError(f"direction must be -1 or +1, got {direction}")
    if n < 2 or finite(low) is None or finite(high) is None:
        return "not testable"
    if paper_effect is not None and (paper_effect == 0 or math.copysign(1, paper_effect) != direction):
        raise ValueError(f"paper_effect {paper_effect} does not have the claimed direction {direction:+d}")
    same_side = low > 0 if direction > 0 else high < 0
    other_side = high < 0 if direction > 0 else low > 0
    if other_side:
        return "refuted"
    if paper_effect is None:
        return "reproduced" if same_side else "not detected"
    holds_paper = low <= paper_effect <= high
    if same_side:
        # the CI lies between 0 and Δ_p: the direction holds, the paper's size does not
        between = high < paper_effect if direction > 0 else low > paper_effect
        return "direction reproduced, magnitude refuted" if between else "reproduced"
    return "not detected" if holds_paper else "refuted"


def majority_class_rate(labels: Sequence[int] | np.ndarray) -> float:
    """Share of the most frequent class: the accuracy of always predicting it (the classification utility floor)."""
    y = np.asarray(labels).reshape(-1)
    if y.size == 0:
        raise ValueError("majority_class_rate: no labels")
    _, counts = np.unique(y, return_counts=True)
    return float(counts.max() / y.size)


def below_utility_floor(summary: Mapping[str, object], map50_floor: float = 0.05, split: str = "test") -> str | None:
    """Why a run "did not learn" (its fairness and privacy values are then not compared), or None when it learned.

    Detection: <split>/map_50 < map50_floor. Classification: <split>/accuracy <= <split>/majority_class_rate (the
    accuracy of a constant prediction). A run without the utility metric is not judged here (None). `split`: "test"
    (the table) or "val" (resfl tune, which never reads the test split).
    """
    name = "" if split == "test" else f"{split} "  # the table's wording unchanged
    map50 = summary.get(f"{split}/map_50")
    if finite(map50) is not None:
        return f"{name}mAP@50 {float(map50):.3f} < {map50_floor}" if float(map50) < map50_floor else None
    acc, majority = summary.get(f"{split}/accuracy"), summary.get(f"{split}/majority_class_rate")
    if finite(acc) is not None and finite(majority) is not None and float(acc) <= float(majority):
        return f"{name}accuracy {float(acc):.3f} <= majority-class rate {float(majority):.3f}"
    return None


def no_positive_at_threshold(summary: Mapping[str, object], split: str = "test") -> str | None:
    """Why a run's group rates at the operating threshold compare nothing, or None: every group's <split>/tpr/<g> is 0,
    so no person was detected (detection: no box scored >= ufm.score_threshold on a matched person) or no example was
    predicted positive. ΔEOP and EOD are then 0 - 0 and DI is 0/0: no group is served better because none is served.
    A run without group TPRs is not judged here (None)."""
    rates = [finite(v) for k, v in summary.items() if k.startswith(f"{split}/tpr/")]
    rates = [r for r in rates if r is not None]
    if rates and all(r == 0.0 for r in rates):
        return f"{split} TPR 0 in all {len(rates)} groups: nothing detected or predicted positive at the threshold"
    return None
