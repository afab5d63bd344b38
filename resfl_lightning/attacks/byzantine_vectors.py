"""What omniscient Byzantine attackers send, from the round's honest updates (docs/method.md §10). Pure functions on
honest[h, P] (rows = the honest clients' updates); every attacker of the round sends the one returned vector.

mu = the honest mean, sigma = the honest coordinate-wise standard deviation (ddof = 1, as torch's default in the
byzantine-robust-optimizer code these attacks descend from), n = h + f updates in the round.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import torch

ALIE_Z_FORMS = ("paper", "honest")
PERTURBATIONS = ("unit", "sign", "std")


def _honest(honest: torch.Tensor, need: int = 1) -> torch.Tensor:
    if honest.dim() != 2 or honest.shape[0] < need:
        raise ValueError(f"need a stack of at least {need} honest updates [h, P], got shape {tuple(honest.shape)}")
    return honest.to(torch.float64)


def alie_z(n: int, f: int, form: str = "paper") -> float:
    """z of ALIE (Baruch et al., NeurIPS 2019): s = floor(n/2 + 1) - f supporters needed;
    paper: z = Phi^-1((n - s)/n); honest: z = Phi^-1((h - s)/h), h = n - f (Karimireddy et al.'s code)."""
    if form not in ALIE_Z_FORMS:
        raise ValueError(f"ALIE z form must be one of {ALIE_Z_FORMS}, got {form!r}")
    s = math.floor(n / 2 + 1) - f
    total = n if form == "paper" else n - f
    p = (total - s) / total
    if not 0 < p < 1:
        raise ValueError(f"ALIE with n={n}, f={f} ({form} form): (total - s)/total = {p} is not in (0, 1)")
    return NormalDist().inv_cdf(p)


def alie(honest: torch.Tensor, f: int, form: str = "paper") -> torch.Tensor:
    """ALIE: mu - z sigma (z from alie_z)."""
    x = _honest(honest, need=2)
    return alie_at(x, alie_z(x.shape[0] + f, f, form))


def alie_at(honest: torch.Tensor, z: float) -> torch.Tensor:
    """mu - z sigma at a given z (the ALIE family whose z optimal ALIE searches)."""
    x = _honest(honest, need=2)
    return x.mean(dim=0) - z * x.std(dim=0)


def ipm(honest: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Inner-product manipulation (Xie, Koyejo & Gupta, UAI 2019): -epsilon mu."""
    if not epsilon > 0:
        raise ValueError(f"IPM epsilon must be > 0, got {epsilon}")
    return -epsilon * _honest(honest).mean(dim=0)


def gaussian(honest: torch.Tensor, std: float | None, generator: torch.Generator) -> torch.Tensor:
    """N(0, s^2 I); s = `std`, or the median honest norm / sqrt(P) when None (our reading; the papers are silent)."""
    x = _honest(honest)
    s = float(np.median(x.norm(dim=1).cpu().numpy())) / math.sqrt(x.shape[1]) if std is None else float(std)
    if not (s >= 0 and math.isfinite(s)):
        raise ValueError(f"Gaussian attack std must be finite and >= 0, got {s}")
    return s * torch.randn(x.shape[1], generator=generator, dtype=torch.float64).to(x.device)


def perturbation(honest: torch.Tensor, kind: str) -> torch.Tensor:
    """p of min-max / min-sum: unit (mu/||mu||), sign (sign mu) or std (sigma)."""
    x = _honest(honest, need=2 if kind == "std" else 1)
    mu = x.mean(dim=0)
    if kind == "unit":
        return mu / mu.norm().clamp_min(1e-300)
    if kind == "sign":
        return mu.sign()
    if kind == "std":
        return x.std(dim=0)
    raise ValueError(f"perturbation must be one of {PERTURBATIONS}, got {kind!r}")


def _pairwise_sq(x: torch.Tensor) -> torch.Tensor:
    sq = (x * x).sum(dim=1)
    return (sq[:, None] + sq[None, :] - 2 * x @ x.T).clamp_min(0)


def min_max_holds(x: torch.Tensor, honest: torch.Tensor) -> bool:
    """max_i ||x - d_i||^2 <= max_{i,j} ||d_i - d_j||^2 (Shejwalkar & Houmansadr, NDSS 2021)."""
    h = _honest(honest)
    return bool(((h - x.to(torch.float64)) ** 2).sum(dim=1).max() <= _pairwise_sq(h).max())


def min_sum_holds(x: torch.Tensor, honest: torch.Tensor) -> bool:
    """sum_i ||x - d_i||^2 <= min_i sum_j ||d_i - d_j||^2."""
    h = _honest(honest)
    return bool(((h - x.to(torch.float64)) ** 2).sum() <= _pairwise_sq(h).sum(dim=1).min())


def gamma_search(holds, gamma_init: float = 10.0, tol: float = 1e-5) -> float:
    """The NDSS'21 search: gamma = step = gamma_init, gamma_ok = 0; while |gamma_ok - gamma| > tol: gamma_ok = gamma
    and gamma += step/2 if holds(gamma), else gamma -= step/2; then step /= 2. Returns gamma_ok (<= 2 gamma_init)."""
    gamma, step, ok = float(gamma_init), float(gamma_init), 0.0
    while abs(ok - gamma) > tol:
        if holds(gamma):
            ok = gamma
            gamma += step / 2
        else:
            gamma -= step / 2
        step /= 2
    return ok


def min_max(honest: torch.Tensor, kind: str = "unit", gamma_init: float = 10.0) -> torch.Tensor:
    """mu - gamma p with the largest gamma (searched) keeping min_max_holds."""
    x = _honest(honest)
    mu, p = x.mean(dim=0), perturbation(x, kind)
    return mu - gamma_search(lambda g: min_max_holds(mu - g * p, x), gamma_init) * p


def min_sum(honest: torch.Tensor, kind: str = "unit", gamma_init: float = 10.0) -> torch.Tensor:
    """mu - gamma p with the largest gamma (searched) keeping min_sum_holds."""
    x = _honest(honest)
    mu, p = x.mean(dim=0), perturbation(x, kind)
    return mu - gamma_search(lambda g: min_sum_holds(mu - g * p, x), gamma_init) * p
