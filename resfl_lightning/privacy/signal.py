"""The noise-to-signal ratio of a DP-SGD step (docs/method.md §5 "DP-SGD", §5a "DP baselines").

A step is g_hat = g_c + N(0, z^2 C^2 I) / B with g_c = (1/B) sum_i clip_C(g_i), B the expected batch size. The noise
along the direction of g_c has standard deviation zC/B, so NSR = zC / (B ||g_c||) compares it with the signal g_c
itself (the whole noise vector is sqrt(d) times larger). ||g_c|| is measured without noise; never a per-sample norm
(clipped per-sample norms are ~C, which would give z/B whatever the gradients do).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def noise_to_signal(z: float, max_grad_norm: float, batch_size: float, signal_norm: float | np.ndarray) -> np.ndarray:
    """zC / (B ||g_c||), elementwise over the steps' ||g_c||; a zero signal gives inf (0 when z = 0: no noise)."""
    norms = np.asarray(signal_norm, dtype=np.float64)
    if z < 0 or max_grad_norm <= 0 or batch_size <= 0 or (norms < 0).any():
        raise ValueError(f"NSR needs z >= 0, C > 0, B > 0 and ||g_c|| >= 0, got {z}, {max_grad_norm}, {batch_size}, "
                         f"min {norms.min() if norms.size else None}")
    noise = z * max_grad_norm
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = noise / (batch_size * norms)
    return np.where(norms > 0, ratio, math.inf if noise > 0 else 0.0)


def median_noise_to_signal(z: float, max_grad_norm: float, batch_size: float, signal_norms: Sequence[float]) -> float:
    """The median over steps of each step's NSR (NaN without steps)."""
    if len(signal_norms) == 0:
        return math.nan
    return float(np.median(noise_to_signal(z, max_grad_norm, batch_size, np.asarray(signal_norms))))
