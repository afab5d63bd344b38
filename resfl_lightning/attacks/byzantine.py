"""Byzantine sign-flip attack (docs/method.md §7) and what an attacker reports about its update.

Attackers are drawn at random each round from (seed, round) — never "the first clients" (docs/method.md §9) — and
the optional l2 bound only rescales an update, it never adds noise.

Report modes (`attack.byzantine.report`), i.e. the u an attacker sends beside its flipped update:
- honest (default, our reading): the UFM pipeline (EMA, clip, gate) on the model it trained, before the flip;
- sent: the same pipeline on the model it actually sends, theta_G + its flipped update, evaluated on its
  validation split (the gate then sees that model's mAP);
- lie: the best value the server accepts, u = clip_low, never gated;
- mimic: the median of the honest clients' reported u of the round (an attacker that observes them); the client
  first reports as `honest`, and the round transform (attacks/byzantine_round.py) replaces its u once the round's
  reports are gathered.

Strengths relative to the attack (`attack.byzantine.gamma`, `ipm_epsilon`): a number, or a name in
RELATIVE_STRENGTHS evaluated at the attack's n (the federation's clients) and f (its round(fraction n) attackers):
n_over_f = n/f, a sign flip that reverses FedAvg's mean (it does for gamma > n/f - 1); h_over_2f = (n - f)/(2f), half
the IPM epsilon past which the mean reverses (f epsilon > n - f).

Schedules (`attack.byzantine.schedule`): `per_round` redraws the attackers each round from (seed, round) (the
behaviour before schedules existed); `fixed` draws the same attackers for the whole run from the seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import torch

from resfl_lightning.data.partition import count_from_fraction

Delta = TypeVar("Delta", torch.Tensor, np.ndarray, Mapping)

_ATTACKER_STREAM = 0x42595A  # separates this RNG stream from other uses of the same seed
_FIXED_STREAM = 0x464958  # the fixed schedule's draw, apart from every per-round draw
REPORT_MODES = ("honest", "sent", "lie", "mimic")
SCHEDULES = ("fixed", "per_round")
RELATIVE_STRENGTHS = {"n_over_f": lambda n, f: n / f, "h_over_2f": lambda n, f: (n - f) / (2 * f)}


def is_strength(value: Any) -> bool:
    """A positive finite number or a name in RELATIVE_STRENGTHS (the values the strength keys accept)."""
    if isinstance(value, str):
        return value in RELATIVE_STRENGTHS
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 and math.isfinite(value)


def strength(value: float | str, n: int, f: int) -> float:
    """The number `value` stands for with n updates of which f are attackers (module docstring)."""
    if not is_strength(value):
        raise ValueError(f"strength must be a number > 0 or one of {list(RELATIVE_STRENGTHS)}, got {value!r}")
    if not isinstance(value, str):
        return float(value)
    if not 0 < f < n:
        raise ValueError(f"strength {value} needs 0 < f < n, got n={n}, f={f}")
    return float(RELATIVE_STRENGTHS[value](n, f))


def choose_attackers(num_clients: int, fraction: float, seed: int, round_idx: int) -> list[int]:
    """Sorted ids of round(fraction*N) attackers for this round; reproducible from (seed, round_idx)."""
    if round_idx < 0:
        raise ValueError(f"round_idx must be >= 0, got {round_idx}")
    k = count_from_fraction(num_clients, fraction)
    rng = np.random.default_rng([seed, round_idx, _ATTACKER_STREAM])
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))


def fixed_attackers(num_clients: int, fraction: float, seed: int) -> list[int]:
    """Sorted ids of round(fraction*N) attackers kept for the whole run (schedule `fixed`); reproducible from seed."""
    k = count_from_fraction(num_clients, fraction)
    rng = np.random.default_rng([seed, _ATTACKER_STREAM, _FIXED_STREAM])
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))


def scheduled_attackers(schedule: str, num_clients: int, fraction: float, seed: int, round_idx: int) -> list[int]:
    """The round's attackers under a schedule (module docstring)."""
    if schedule == "per_round":
        return choose_attackers(num_clients, fraction, seed, round_idx)
    if schedule == "fixed":
        if round_idx < 0:
            raise ValueError(f"round_idx must be >= 0, got {round_idx}")
        return fixed_attackers(num_clients, fraction, seed)
    raise ValueError(f"attacker schedule must be one of {SCHEDULES}, got {schedule!r}")


def _is_float(v: Any) -> bool:
    return v.is_floating_point() if isinstance(v, torch.Tensor) else np.asarray(v).dtype.kind == "f"


def _l2_norm(delta: Any) -> float:
    """Joint l2 norm over a tensor / array or over the floating entries of a mapping."""
    if isinstance(delta, Mapping):
        return math.sqrt(sum(_l2_norm(v) ** 2 for v in delta.values() if _is_float(v)))
    if isinstance(delta, torch.Tensor):
        return float(torch.linalg.vector_norm(delta.detach().double()))
    return float(np.linalg.norm(np.asarray(delta, dtype=np.float64).ravel()))


def _scale(delta: Delta, factor: float) -> Delta:
    """factor * delta; in a mapping only floating entries scale (integer buffers pass through unchanged)."""
    if isinstance(delta, Mapping):
        return {k: (v * factor if _is_float(v) else v) for k, v in delta.items()}
    return delta * factor


def sign_flip(delta: Delta, gamma: float) -> Delta:
    """-gamma * delta (tensor, array, or name -> tensor mapping); gamma > 0."""
    if not (gamma > 0 and math.isfinite(gamma)):
        raise ValueError(f"gamma must be a positive finite number, got {gamma}")
    return _scale(delta, -float(gamma))


def _bound(delta: Delta, bound: float) -> Delta:
    if not (bound > 0 and math.isfinite(bound)):
        raise ValueError(f"l2 bound must be a positive finite number, got {bound}")
    norm = _l2_norm(delta)
    if not math.isfinite(norm):
        raise ValueError("delta contains non-finite values")
    return delta if norm <= bound else _scale(delta, bound / norm)


def l2_bound(delta: Delta, bound: float) -> Delta:
    """Rescale delta so its l2 norm is <= bound (unchanged when already within); deterministic, no noise."""
    return _bound(delta, bound)


def byzantine_transform(delta: Delta, gamma: float, l2_bound: float | None = None) -> Delta:
    """What a Byzantine client sends: -gamma * delta, then optionally rescaled to l2 norm <= l2_bound."""
    flipped = sign_flip(delta, gamma)
    return flipped if l2_bound is None else _bound(flipped, l2_bound)


def attacker_report(mode: str, honest: Any, validate_sent: Callable[[], Any],
                    report_u: Callable[[float, float], tuple[float, float, bool]],
                    clip_low: float) -> tuple[Any, tuple[float, float, bool]]:
    """(the evaluation the attacker's report carries, (EMA state, u, gated)) under a report mode (module docstring).

    `honest` is the evaluation of the model the attacker trained; `validate_sent()` evaluates theta_G + the update it
    sends; `report_u(ufm_raw, utility)` is the client's own EMA -> clip -> gate step, run once on the reported model.
    """
    if mode not in REPORT_MODES:
        raise ValueError(f"report mode must be one of {REPORT_MODES}, got {mode!r}")
    result = validate_sent() if mode == "sent" else honest  # mimic: honest here, its u replaced after the gather
    ema, u, gated = report_u(result.ufm_raw, result.utility)
    if mode == "lie":
        u, gated = float(clip_low), False
    return result, (ema, u, gated)
