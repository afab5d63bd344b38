"""The exact privacy curve of the plain (not subsampled) Gaussian mechanism, for PUFFLE's shared counts
(clients/parity_rates.py, docs/method.md §5a).

R releases with noise multiplier z each (noise std = z x L2 sensitivity) compose to one Gaussian mechanism with
mu = sqrt(R) / z, whose tight (epsilon, delta) curve is delta(epsilon) = Phi(-epsilon/mu + mu/2) -
e^epsilon Phi(-epsilon/mu - mu/2) (Balle & Wang 2018, Thm 8; Dong, Roth & Su 2019, Cor. 2.13). Closed form, so no
numerical accountant is needed: opacus' RDP cannot certify a small epsilon at sample rate 1 (its orders stop at 63)
and its noise search stops at a 0.01 epsilon tolerance, coarse for a share like 0.1."""

from __future__ import annotations

import math
from collections.abc import Iterable

_BISECTIONS = 200


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def gaussian_delta(epsilon: float, mu: float) -> float:
    """delta of a mu-Gaussian mechanism at epsilon (decreasing in epsilon, increasing in mu)."""
    if mu <= 0:
        return 0.0
    return max(0.0, _phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * _phi(-epsilon / mu - mu / 2))


def _bisect(f, lo: float, hi: float) -> float:
    """The largest x in [lo, hi] with f(x) true, for f true at lo and false from some point on."""
    while f(hi):
        lo, hi = hi, 2 * hi
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) else (lo, mid)
    return lo


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The largest mu whose mechanism is (epsilon, delta)-DP."""
    return _bisect(lambda mu: gaussian_delta(epsilon, mu) <= delta, 0.0, 1.0)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon at which a mu-Gaussian mechanism is (epsilon, delta)-DP (0 for mu = 0)."""
    if mu <= 0 or gaussian_delta(0.0, mu) <= delta:
        return 0.0
    return _bisect(lambda eps: gaussian_delta(eps, mu) > delta, 0.0, 1.0)


def noise_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """z of each of `releases` Gaussian releases so that all of them together are (epsilon, delta)-DP."""
    return math.sqrt(releases) / gaussian_mu(epsilon, delta)


def spent_epsilon(history: Iterable[tuple[float, int]], delta: float) -> float:
    """epsilon of the releases so far, (z, count) rows: mu = sqrt(sum count / z^2); inf if one had no noise."""
    rows = list(history)
    if any(z == 0 for z, n in rows if n):
        return math.inf
    return gaussian_epsilon(math.sqrt(sum(n / z**2 for z, n in rows)), delta)
