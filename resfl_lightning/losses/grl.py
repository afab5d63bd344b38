"""Gradient Reversal Layer (Ganin & Lempitsky 2015): identity forward, gradient times -scale backward."""

from __future__ import annotations

import math

import torch
from torch import nn


def _check_scale(scale: float) -> float:
    scale = float(scale)
    if not scale >= 0.0:  # also rejects NaN
        raise ValueError(f"GRL scale (lambda) must be >= 0, got {scale}")
    return scale


class GradientReversalFunction(torch.autograd.Function):
    """Autograd function behind :class:`GradientReversal`; use ``GradientReversalFunction.apply(x, scale)``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:  # noqa: D102
        ctx.scale = scale
        # view_as keeps the forward an identity while giving autograd a distinct node to attach backward to.
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: D102
        return grad_output.neg() * ctx.scale, None


def gradient_reversal(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Functional GRL: returns ``x`` unchanged; the gradient flowing back is multiplied by ``-scale``."""
    return GradientReversalFunction.apply(x, _check_scale(scale))


class GradientReversal(nn.Module):
    """GRL module with a mutable ``scale`` (lambda) so schedules can change it between steps."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale

    @property
    def scale(self) -> float:
        return self._scale

    @scale.setter
    def scale(self, value: float) -> None:
        self._scale = _check_scale(value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GradientReversalFunction.apply(x, self._scale)

    def extra_repr(self) -> str:
        return f"scale={self._scale}"


GRL_SCHEDULES = ("constant", "dann")


def dann_coefficient(progress: float, gamma: float = 10.0) -> float:
    """DANN's ramp 2 / (1 + exp(-gamma p)) - 1 of the training progress p in [0, 1] (Ganin et al., JMLR 2016): 0
    at the start, ~1 by p = 0.5 with gamma = 10, so early, noisy adversary gradients reach the encoder damped."""
    if not 0.0 <= progress <= 1.0:
        raise ValueError(f"dann_coefficient: progress must lie in [0, 1], got {progress}")
    if not gamma > 0:
        raise ValueError(f"dann_coefficient: gamma must be > 0, got {gamma}")
    return 2.0 / (1.0 + math.exp(-gamma * progress)) - 1.0
