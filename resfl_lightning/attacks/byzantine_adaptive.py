"""Adaptive attacks on `resfl_robust` (docs/method.md §10, issue 57 item 2): attackers that know the rule (its cap,
softmax, trust, norm clip and report check) and the round's honest updates, but not the server's root split or its
root update g0 (the threat model of docs/method.md "Threat model of resfl_robust").

Pure functions on the round's rows in float64, on the attacked coordinates: `own` = the attackers' own trained
updates [f, P], `honest` = the honest updates [h, P]. The attackers estimate g0 by the mean of their own updates
(ghat: the root update their own data predicts; they never see the root split), and every attacker sends the one
vector returned. Each vector has the median honest norm M: `clip=norm` scales nothing at or under the round's
median norm, and f copies of M leave that median where the honest updates put it, so the vector arrives unscaled.

- steer: the vector of norm M at cosine c with ghat whose remaining mass points along p (its part orthogonal to
  ghat). Trust is ReLU(cos(., g0)), so a vector needs a positive cosine with g0 to get any weight; with ghat for g0,
  every c > 0 is accepted, and the smaller c, the more of the vector goes where the attackers want.
- adaptive_trust: p = -mu (mu = the honest mean), c = `trust_margin`: the v of norm M with the largest -<v, mu>
  subject to cos(v, ghat) >= margin. The harm grows as v turns from ghat towards -mu, so the constraint binds (unless
  -mu itself keeps the margin, when v = -M mu/|mu|).
- adaptive_cap: p = -mu, c = the smallest cosine at which the capped simplex, fed the attackers' estimate of the
  scores, gives each attacker the cap (found by bisection: an attacker's capped weight does not decrease with its
  score), plus `trust_margin` as slack for the estimate's error. It probes the promise "any f clients hold at most
  f/(n - f)": the attackers take all the weight the cap allows, with the least alignment that still buys it.
- adaptive_drift: p = one fixed direction for the whole run (a unit vector drawn from the run's seed: the attackers
  agree on it in advance, and a resumed run draws the same one), c = `trust_margin`: a small step accepted every
  round whose components along p add up over the rounds instead of averaging out.
- within_se_report: in `mode=checked` a report is kept when |u - u_server| <= k SE, SE = sqrt(SE_server^2 +
  SE_client^2); reporting u_hat - (k - eps) SE_client (u_hat = the server's formula on the attacker's own validation
  of what it sends) passes whenever the estimate is within eps SE_client of the server's value, since SE_client is a
  lower bound of the SE the server uses; the lowest u takes the largest softmax weight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from resfl_lightning.aggregation.resfl_robust import capped_weights

_DRIFT_STREAM = 0x445246


class Adaptive(NamedTuple):
    sent: torch.Tensor  # what every attacker sends
    cosine: float  # the cosine with the attackers' estimate of the root update it was built for


def _unit(v: torch.Tensor, what: str) -> torch.Tensor:
    norm = float(v.norm())
    if not (norm > 0 and math.isfinite(norm)):
        raise ValueError(f"{what} has norm {norm}: no direction to steer by")
    return v / norm


def median_norm(honest: torch.Tensor) -> float:
    """The median honest norm (numpy's median: the mean of the two middle values for an even count)."""
    return float(np.median(honest.to(torch.float64).norm(dim=1).cpu().numpy()))


def steer(estimate: torch.Tensor, towards: torch.Tensor, cosine: float, norm: float) -> torch.Tensor:
    """norm * (c a + sqrt(1 - c^2) q): a = estimate/|estimate|, q = the unit part of `towards` orthogonal to a. When
    `towards` has no such part (it lies along a), norm * a: no vector at cosine c points further its way."""
    if not 0 < cosine <= 1:
        raise ValueError(f"cosine must lie in (0, 1], got {cosine}")
    a = _unit(estimate.to(torch.float64), "the estimate of the root update")
    p = towards.to(torch.float64)
    q = p - (p @ a) * a
    if float(q.norm()) <= 1e-12 * max(float(p.norm()), 1e-300):
        return norm * a
    return norm * (cosine * a + math.sqrt(max(0.0, 1 - cosine * cosine)) * q / q.norm())


def trust_aware(own: torch.Tensor, honest: torch.Tensor, margin: float) -> Adaptive:
    """adaptive_trust: argmax -<v, mu> over ||v|| = M, cos(v, ghat) >= margin. A linear objective on the sphere: its
    free maximiser -M mu/|mu| when that keeps the margin (ghat more than 90 + arcsin(margin) degrees off mu), else the
    constraint binds and the maximiser lies on its cone, in the plane of ghat and mu (steer at the margin)."""
    x = honest.to(torch.float64)
    ghat, mu, norm = own.to(torch.float64).mean(dim=0), x.mean(dim=0), median_norm(x)
    free = float(-mu @ ghat) / max(float(mu.norm() * ghat.norm()), 1e-300)
    if free >= margin and float(mu.norm()) > 0:
        return Adaptive(-norm * mu / mu.norm(), free)
    return Adaptive(steer(ghat, -mu, margin, norm), float(margin))


def drift_direction(size: int, seed: int) -> torch.Tensor:
    """The fixed unit direction of adaptive_drift: drawn from the run's seed alone (the same every round)."""
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, _DRIFT_STREAM]).generate_state(1)[0]))
    return _unit(torch.randn(size, generator=gen, dtype=torch.float64), "the drift direction")


def drift(own: torch.Tensor, honest: torch.Tensor, direction: torch.Tensor, margin: float) -> Adaptive:
    """adaptive_drift: norm M at cosine `margin` with ghat, the rest along the fixed `direction`."""
    sent = steer(own.to(torch.float64).mean(dim=0), direction, margin, median_norm(honest))
    return Adaptive(sent, float(margin))


def attackers_share(cosine: float, honest_trust: np.ndarray, soft: np.ndarray, f: int, cap: float) -> float:
    """The attackers' total capped weight when each of the f has trust `cosine`: scores = soft * trust over the h
    honest rows then the f attackers (soft: the softmax of -beta u over all n, in that order), as resfl_robust
    weighs them (capped_weights)."""
    scores = np.asarray(soft, dtype=np.float64) * np.concatenate([np.asarray(honest_trust, np.float64),
                                                                  np.full(f, float(cosine))])
    if not (scores > 0).any():
        return 0.0
    return float(capped_weights(scores, cap)[-f:].sum())


def cap_cosine(share: Callable[[float], float], target: float, evals: int) -> float:
    """The smallest cosine in (0, 1] whose share reaches `target`, to 2^-evals (bisection: share does not decrease
    with the cosine); 1 when even cosine 1 falls short (the most weight the attackers can estimate to get)."""
    reached = target * (1 - 1e-9)
    if share(1.0) < reached:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(evals):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if share(mid) >= reached else (mid, hi)
    return hi


def cap_aware(own: torch.Tensor, honest: torch.Tensor, u: np.ndarray, beta: float, cap: float, slack: float,
              evals: int) -> Adaptive:
    """adaptive_cap: -mu steered at the smallest cosine with ghat whose estimated capped weight is the cap for each
    attacker, plus `slack` (at most 1). `u` holds the n values the attackers expect the softmax to read (honest rows
    first, then the attackers'); NaN anywhere: the softmax is left out of the estimate (uniform).
    Honest trust is estimated as ReLU(cos(d_i, ghat))."""
    x, mine = honest.to(torch.float64), own.to(torch.float64)
    f = mine.shape[0]
    ghat = _unit(mine.mean(dim=0), "the estimate of the root update")
    norms = x.norm(dim=1)
    honest_trust = torch.where(norms > 0, (x @ ghat) / norms.clamp_min(1e-300), torch.zeros_like(norms))
    honest_trust = honest_trust.clamp_min(0.0).cpu().numpy()
    u = np.asarray(u, dtype=np.float64)
    soft = np.full(u.size, 1.0 / u.size) if not np.isfinite(u).all() else np.exp(-beta * (u - u.min()))
    soft = soft / soft.sum()
    target = min(1.0, f * cap)
    c = cap_cosine(lambda c: attackers_share(c, honest_trust, soft, f, cap), target, evals)
    c = min(1.0, c + slack)
    return Adaptive(steer(ghat, -x.mean(dim=0), c, median_norm(x)), c)


def within_se_report(u_hat: float, se: float, k: float, margin: float, floor: float) -> float:
    """u_hat - (k - margin) * se, not below `floor` (ufm.clip_low, the lowest u an honest client can report); a
    non-finite se counts as 0 (the server's check reads it so too)."""
    if not 0 < margin < k:
        raise ValueError(f"the report margin must lie in (0, k = {k}), got {margin}")
    se = se if math.isfinite(se) else 0.0
    return max(float(floor), float(u_hat) - (k - margin) * se)
