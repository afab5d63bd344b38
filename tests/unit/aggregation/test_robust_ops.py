"""Capped-simplex projection vs a scipy QP; weighted median / trimmed mean vs numpy and scipy; clipping vs numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from resfl_lightning.aggregation.robust_ops import (
    centered_clip,
    norm_bound,
    project_capped_simplex,
    trust_scores,
    weighted_median,
    weighted_trimmed_mean,
)


def qp_capped_simplex(y: np.ndarray, cap: float) -> np.ndarray:
    """The same projection as a generic constrained QP (scipy's trust-constr)."""
    n = len(y)
    res = optimize.minimize(lambda w: ((w - y) ** 2).sum(), np.full(n, 1 / n), jac=lambda w: 2 * (w - y),
                            hess=lambda w: 2 * np.eye(n), method="trust-constr",
                            bounds=optimize.Bounds(np.zeros(n), np.full(n, cap)),
                            constraints=[optimize.LinearConstraint(np.ones((1, n)), 1, 1)],
                            options={"gtol": 1e-12, "xtol": 1e-14, "maxiter": 5000})
    return res.x


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=8), st.floats(0.0, 1.0))
def test_capped_simplex_matches_a_scipy_qp(values, cap_share):
    y = np.asarray(values)
    n = len(y)
    cap = 1 / n + cap_share * (1 - 1 / n)  # any feasible cap in [1/n, 1]
    w = project_capped_simplex(y, cap)
    assert w.sum() == pytest.approx(1.0, abs=1e-9)
    assert (w >= -1e-12).all() and (w <= cap + 1e-12).all()
    ref = qp_capped_simplex(y, cap)
    gap = ((ref - y) ** 2).sum() - ((w - y) ** 2).sum()
    assert gap >= -1e-9  # no feasible point the QP found is closer
    # the objective is 2-strongly convex, so the true minimiser w satisfies ||ref - w||^2 <= f(ref) - f(w) for any
    # feasible ref (the QP stops ~1e-8 short of the optimum, which alone allows ~1e-4 in w)
    assert ((ref - w) ** 2).sum() <= gap + 1e-9
    # and the KKT form w = clip(y - t, 0, cap), with t found by scipy's root finder
    if n * cap - 1 < 1e-9:  # cap = 1/n: the only feasible point
        np.testing.assert_allclose(w, np.full(n, cap), atol=1e-9)
    else:
        t = optimize.brentq(lambda t: np.clip(y - t, 0, cap).sum() - 1, y.min() - cap - 1, y.max() + 1, xtol=1e-15)
        np.testing.assert_allclose(w, np.clip(y - t, 0, cap), atol=1e-9)


def test_capped_simplex_hand_cases_and_infeasible_cap():
    # a dominant score is cut to the cap, the rest share what is left in proportion of their excess over t
    np.testing.assert_allclose(project_capped_simplex([0.97, 0.01, 0.01, 0.01], cap=1 / 3),
                               [1 / 3, 2 / 9, 2 / 9, 2 / 9])
    np.testing.assert_allclose(project_capped_simplex([0.25] * 4, cap=1 / 3), [0.25] * 4)  # already inside
    np.testing.assert_allclose(project_capped_simplex([5.0, 1.0], cap=1.0), [1.0, 0.0])  # the plain simplex
    with pytest.raises(ValueError, match="infeasible"):
        project_capped_simplex([0.5, 0.5, 0.0], cap=0.3)


def test_weighted_combiners_reduce_to_numpy_with_equal_weights():
    gen = torch.Generator().manual_seed(0)
    for n in (5, 6, 10):
        x = torch.randn(n, 7, generator=gen, dtype=torch.float64)
        ones = torch.ones(n, dtype=torch.float64)
        np.testing.assert_allclose(weighted_median(x, ones).numpy(), np.median(x.numpy(), axis=0))
        for k in range(0, (n - 1) // 2 + 1):
            beta = k / n
            np.testing.assert_allclose(weighted_trimmed_mean(x, ones, beta).numpy(),
                                       stats.trim_mean(x.numpy(), beta, axis=0), atol=1e-12)


def test_weighted_median_and_trimmed_mean_hand_case():
    x = torch.tensor([[1.0], [2.0], [3.0], [10.0]], dtype=torch.float64)
    # cumulative weights 0.1, 0.2, 0.8, 1.0: the median is the third value
    assert float(weighted_median(x, torch.tensor([0.1, 0.1, 0.6, 0.2]))) == 3.0
    # exactly 1/2 after the second value (the zero-weight 3 is skipped): mean of 2 and 10
    assert float(weighted_median(x, torch.tensor([0.25, 0.25, 0.0, 0.5]))) == 6.0
    # trim mass 0.25 from each end of weights (0.1, 0.1, 0.6, 0.2): keep 0.5 of the value 3 only
    assert float(weighted_trimmed_mean(x, torch.tensor([0.1, 0.1, 0.6, 0.2]), 0.25)) == pytest.approx(3.0)
    # trim 0.2: keep 0.05 of 2, 0.6 of 3 -> (0.1 + 1.8)/0.65... minus nothing of 10 (its 0.2 mass is all trimmed)
    got = float(weighted_trimmed_mean(x, torch.tensor([0.1, 0.15, 0.55, 0.2]), 0.2))
    assert got == pytest.approx((0.05 * 2 + 0.55 * 3) / 0.6)
    with pytest.raises(ValueError, match="weights"):
        weighted_median(x, torch.tensor([1.0, -1.0, 1.0, 1.0]))


def test_norm_bound_and_centered_clip_match_numpy_loops():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 5)) * rng.uniform(0.1, 5, size=(6, 1))
    clipped, m = norm_bound(torch.from_numpy(x))
    norms = np.linalg.norm(x, axis=1)
    assert m == pytest.approx(np.median(norms))
    expected = np.stack([row * min(1.0, m / nrm) for row, nrm in zip(x, norms)])
    np.testing.assert_allclose(clipped.numpy(), expected)
    assert norm_bound(torch.from_numpy(x), 1.0)[1] == 1.0

    center = rng.normal(size=5)
    v, tau = centered_clip(torch.from_numpy(x), torch.from_numpy(center), iterations=3)
    ref_v = center.copy()
    ref_tau = np.median(np.linalg.norm(x - center, axis=1))
    for _ in range(3):
        ref_v = ref_v + np.mean([(row - ref_v) * min(1.0, ref_tau / np.linalg.norm(row - ref_v)) for row in x], axis=0)
    assert tau == pytest.approx(ref_tau)
    np.testing.assert_allclose(v.numpy(), ref_v)


def test_trust_scores_are_relu_cosines():
    g = torch.tensor([1.0, 0.0], dtype=torch.float64)
    d = torch.tensor([[2.0, 0.0], [1.0, 1.0], [-1.0, 0.5], [0.0, 0.0]], dtype=torch.float64)
    np.testing.assert_allclose(trust_scores(d, g).numpy(), [1.0, 2 ** -0.5, 0.0, 0.0])
