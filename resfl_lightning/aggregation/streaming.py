"""The streaming weighted sum behind every StreamingRule: sum_i softmax(s)_i delta_i, one client at a time."""

from __future__ import annotations

import math

import torch


class StreamingWeightedSum:
    """sum_i softmax(s)_i * delta_i folded one client at a time, in float64, with online max-rescaling."""

    def __init__(self, numel: int, device: torch.device | str = "cpu"):
        self.acc = torch.zeros(numel, dtype=torch.float64, device=device)
        self.max_score = -math.inf
        self.normaliser = 0.0  # sum_i exp(s_i - max_score)

    def add(self, score: float, delta: torch.Tensor) -> None:
        if not torch.isfinite(delta).all():
            raise FloatingPointError("non-finite values in a client update")
        if score == -math.inf:  # weight exactly 0 (e.g. FairFed drove it to zero)
            return
        if score > self.max_score:
            shrink = math.exp(self.max_score - score) if math.isfinite(self.max_score) else 0.0
            self.acc.mul_(shrink)
            self.normaliser *= shrink
            self.max_score = score
        w = math.exp(score - self.max_score)
        self.acc.add_(delta.to(torch.float64), alpha=w)
        self.normaliser += w

    def rescale_for_global(self, global_max: float, global_normaliser: float) -> torch.Tensor:
        """This rank's share of the global weighted mean; summing the shares over ranks gives the mean."""
        if self.normaliser == 0.0:
            return self.acc
        return self.acc * (math.exp(self.max_score - global_max) / global_normaliser)


def combine_normalisers(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """(max_score, normaliser) per rank -> the global max and the global normaliser at that max."""
    live = [(m, z) for m, z in pairs if z > 0]
    if not live:
        raise ValueError("no client contributed an update this round")
    gmax = max(m for m, _ in live)
    return gmax, sum(z * math.exp(m - gmax) for m, z in live)
