"""Pure building blocks of the robust rules (docs/method.md §10):
norm bounding, centered clipping, FLTrust trust scores,
the capped-simplex projection and weighted coordinate-wise median / trimmed mean. Every function works on a stack
deltas[N, P] and computes in float64."""

from __future__ import annotations

import math

import numpy as np
import torch


def median(values: torch.Tensor) -> float:
    """Median of a 1-d tensor, the mean of the two middle values for an even count (numpy's convention; torch's
    median returns the lower one)."""
    ordered = values.to(torch.float64).sort().values
    mid = ordered.numel() // 2
    return float(ordered[mid]) if ordered.numel() % 2 else float((ordered[mid - 1] + ordered[mid]) / 2)


def norm_bound(deltas: torch.Tensor, bound: float | None = None) -> tuple[torch.Tensor, float]:
    """(rows scaled by min(1, M / ||row||), M); M = `bound`, or the median row norm when None (Sun et al. 2019; the
    median is our reading: the paper leaves M open)."""
    x = deltas.to(torch.float64)
    norms = x.norm(dim=1)
    m = median(norms) if bound is None else float(bound)
    if not (m >= 0 and math.isfinite(m)):
        raise ValueError(f"norm bound must be a finite number >= 0, got {m}")
    factor = torch.where(norms > m, m / norms.clamp_min(1e-300), torch.ones_like(norms))
    return x * factor[:, None], m


def centered_clip(deltas: torch.Tensor, center: torch.Tensor, tau: float | None = None,
                  iterations: int = 1) -> tuple[torch.Tensor, float]:
    """Centered clipping (Karimireddy, He & Jaggi, ICML 2021): v_{l+1} = v_l + (1/n) sum_i (d_i - v_l)
    min(1, tau / ||d_i - v_l||) from v_0 = `center`. tau = median_i ||d_i - v_0|| when None (our reading).
    Returns (v_L, tau)."""
    if iterations < 1:
        raise ValueError(f"centered clipping needs iterations >= 1, got {iterations}")
    x = deltas.to(torch.float64)
    v = center.to(torch.float64)
    if tau is None:
        tau = median((x - v).norm(dim=1))
    if not (tau >= 0 and math.isfinite(tau)):
        raise ValueError(f"centered clipping tau must be a finite number >= 0, got {tau}")
    for _ in range(iterations):
        diff = x - v
        norms = diff.norm(dim=1)
        factor = torch.where(norms > tau, tau / norms.clamp_min(1e-300), torch.ones_like(norms))
        v = v + (diff * factor[:, None]).mean(dim=0)
    return v, tau


def trust_scores(deltas: torch.Tensor, root: torch.Tensor) -> torch.Tensor:
    """FLTrust's TS_i = ReLU(cos(d_i, g_0)) (Cao et al., NDSS 2021); 0 for a zero update or a zero root update."""
    x, g = deltas.to(torch.float64), root.to(torch.float64)
    denom = x.norm(dim=1) * g.norm()
    cos = torch.where(denom > 0, (x @ g) / denom.clamp_min(1e-300), torch.zeros_like(denom))
    return cos.clamp_min(0.0)


def project_capped_simplex(y: np.ndarray | list[float], cap: float) -> np.ndarray:
    """argmin ||w - y||^2 s.t. sum w = 1, 0 <= w <= cap (Wang & Lu 2015, arXiv 1503.01002).

    w_i = min(cap, max(0, y_i - t)) with t solving sum_i w_i = 1; the sum is piecewise linear and non-increasing in t
    with breakpoints {y_i, y_i - cap}, so t lies on the segment between the two breakpoints where it crosses 1."""
    y = np.asarray(y, dtype=np.float64)
    n = y.size
    if n == 0 or not np.isfinite(y).all():
        raise ValueError(f"capped simplex: need a non-empty finite vector, got {y}")
    if not (cap > 0 and n * cap >= 1 - 1e-12):
        raise ValueError(f"capped simplex: infeasible cap {cap} for {n} weights (needs n * cap >= 1)")

    def total(t: float) -> float:
        return float(np.clip(y - t, 0.0, cap).sum())

    points = np.unique(np.concatenate([y, y - cap]))  # ascending; total() is non-increasing in t
    sums = np.array([total(t) for t in points])
    # total(t) = n*cap >= 1 for t <= min(y) - cap and 0 for t >= max(y): 1 is crossed between two breakpoints.
    k = int(np.searchsorted(-sums, -1.0, side="left"))  # first breakpoint whose total <= 1
    if k == 0:
        t = float(points[0])
    else:
        t0, t1, s0, s1 = points[k - 1], points[k], sums[k - 1], sums[k]
        t = float(t0 + (s0 - 1.0) * (t1 - t0) / (s0 - s1)) if s0 != s1 else float(t1)
    return np.clip(y - t, 0.0, cap)


def weighted_trimmed_mean(deltas: torch.Tensor, weights: torch.Tensor, beta: float) -> torch.Tensor:
    """Per coordinate: drop weight mass beta at each end of the sorted values and average the rest by weight.
    With equal weights and beta = k/n it is the ordinary trimmed mean dropping k values at each end."""
    if not 0 <= beta < 0.5:
        raise ValueError(f"trimmed mean beta must lie in [0, 0.5), got {beta}")
    w = _normalised(weights, deltas.shape[0])
    values, order = deltas.to(torch.float64).sort(dim=0)
    cum = w[order].cumsum(dim=0)
    prev = cum - w[order]
    kept = (cum.clamp(max=1 - beta) - prev.clamp(min=beta)).clamp_min(0.0)
    return (kept * values).sum(dim=0) / kept.sum(dim=0)


def weighted_median(deltas: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per coordinate: the value where the cumulative weight reaches 1/2 (the mean of the two values around it when
    it lands exactly on 1/2, numpy's convention for equal weights and an even count)."""
    w = _normalised(weights, deltas.shape[0])
    values, order = deltas.to(torch.float64).sort(dim=0)
    cum = w[order].cumsum(dim=0)
    tol = 1e-12
    last = values.shape[0] - 1
    lower = (cum < 0.5 - tol).sum(dim=0).clamp(max=last)  # the first value whose cumulative weight reaches 1/2
    upper = (cum <= 0.5 + tol).sum(dim=0).clamp(max=last)  # the first value past 1/2 (skips zero weights)
    upper = torch.maximum(upper, lower)
    return (values.gather(0, lower[None]).squeeze(0) + values.gather(0, upper[None]).squeeze(0)) / 2


def _normalised(weights: torch.Tensor, n: int) -> torch.Tensor:
    w = torch.as_tensor(weights, dtype=torch.float64)
    if w.shape != (n,) or not torch.isfinite(w).all() or (w < 0).any() or float(w.sum()) <= 0:
        raise ValueError(f"weights must be {n} finite non-negative values with a positive sum, got {w.tolist()}")
    return w / w.sum()
