"""Calibrated omniscient attacks (docs/method.md §10): a fixed attack family whose strength is searched against the
configured rule. Pure functions of honest[h, P] and `aggregate`, where aggregate(sent) is the rule's aggregate of the
round when every attacker sends `sent` (on the same coordinates; attacks/byzantine_round.py builds it from the rule's
`preview`). The objective is the deviation ||aggregate(sent) - mu|| from the honest mean mu.

- optimal_alie / optimal_ipm (byzfl's Optimal-ALIE / Optimal-IPM): mu - z sigma or -eps mu, the strength found by
  line_maximise from the fixed attack's own strength, so the result moves the aggregate at least as far as it;
- tailored_min_max / tailored_min_sum (Shejwalkar & Houmansadr, NDSS 2021, AGR-tailored: gamma maximising the
  deviation of the rule's output): mu - gamma p, gamma found by line_maximise from the rule-agnostic gamma, so the
  result moves the aggregate at least as far as min_max / min_sum. The paper's per-rule binary searches (e.g. "the
  largest gamma Krum still selects") climb a deviation that is increasing up to the rule's edge; one search that
  reads the deviation itself serves every rule, a user's own included, and does not mistake a far-off gamma where the
  rule picks an honest update for progress.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from resfl_lightning.attacks import byzantine_vectors as vectors

Aggregate = Callable[[torch.Tensor], torch.Tensor]
TAILORED = {"tailored_min_max": vectors.min_max_holds, "tailored_min_sum": vectors.min_sum_holds}


class Calibrated(NamedTuple):
    sent: torch.Tensor  # what every attacker sends
    strength: float  # z, eps or gamma chosen
    deviation: float  # ||aggregate(sent) - mu||


def deviation(aggregate: Aggregate, mu: torch.Tensor) -> Callable[[torch.Tensor], float]:
    return lambda sent: float((aggregate(sent).to(torch.float64) - mu).norm())


def line_maximise(objective: Callable[[float], float], start: float, evals: int = 16, step: float = 1.0,
                  ratio: float = 0.8) -> tuple[float, float]:
    """Best-effort argmax of objective over x >= 0 in `evals` evaluations (byzfl's LineMaximize scheme): from `start`,
    step forward, doubling the step while the objective improves; then probe back and forth around the best x found,
    the step shrinking by `ratio` after each probe. Returns (x, objective(x)) of the best x evaluated (`start` when
    nothing beats it)."""
    if evals < 1 or start < 0 or not step > 0 or not 0 < ratio < 1:
        raise ValueError(f"line search needs evals >= 1, start >= 0, step > 0, ratio in (0, 1); got {evals}, "
                         f"{start}, {step}, {ratio}")
    best_x, best_y = float(start), objective(float(start))
    probe, left = best_x, evals - 1
    while left > 0:  # expand
        probe, left = best_x + step, left - 1
        y = objective(probe)
        if y > best_y:
            best_x, best_y, step = probe, y, step * 2
        else:
            step *= ratio
            break
    while left > 0:  # contract around the best
        if probe < best_x:
            probe += step
        else:
            below = probe - step
            while below < 0:  # stay in x >= 0, halving the way back
                below = (below + probe) / 2
            probe = below
        y, left = objective(probe), left - 1
        if y > best_y:
            best_x, best_y = probe, y
        step *= ratio
    return best_x, best_y


def optimal_alie(honest: torch.Tensor, aggregate: Aggregate, start: float, evals: int = 16) -> Calibrated:
    """mu - z sigma with z >= 0 line-searched from `start` (the fixed ALIE's z) to maximise the deviation."""
    x = honest.to(torch.float64)
    dev = deviation(aggregate, x.mean(dim=0))
    z, moved = line_maximise(lambda z: dev(vectors.alie_at(x, z)), max(0.0, start), evals)
    return Calibrated(vectors.alie_at(x, z), z, moved)


def optimal_ipm(honest: torch.Tensor, aggregate: Aggregate, start: float, evals: int = 16) -> Calibrated:
    """-eps mu with eps >= 0 line-searched from `start` (the fixed IPM's eps) to maximise the deviation."""
    mu = honest.to(torch.float64).mean(dim=0)
    dev = deviation(aggregate, mu)
    eps, moved = line_maximise(lambda e: dev(-e * mu), start, evals)
    return Calibrated(-eps * mu, eps, moved)


def tailored(kind: str, honest: torch.Tensor, aggregate: Aggregate, perturbation: str = "unit",
             gamma_init: float = 10.0, evals: int = 16) -> Calibrated:
    """mu - gamma p with gamma line-searched to maximise the deviation, from the rule-agnostic gamma (min_max_holds /
    min_sum_holds, the NDSS search from gamma_init) and with that gamma as the first step (gamma is in the updates'
    units: the search then scales with them)."""
    if kind not in TAILORED:
        raise ValueError(f"tailored attack must be one of {list(TAILORED)}, got {kind!r}")
    x = honest.to(torch.float64)
    mu, p = x.mean(dim=0), vectors.perturbation(x, perturbation)
    dev = deviation(aggregate, mu)
    agnostic = vectors.gamma_search(lambda g: TAILORED[kind](mu - g * p, x), gamma_init)
    gamma, moved = line_maximise(lambda g: dev(mu - g * p), agnostic, evals, step=agnostic if agnostic > 0 else 1.0)
    return Calibrated(mu - gamma * p, gamma, moved)
