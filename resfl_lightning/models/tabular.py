"""TabularNet: an MLP (Linear -> BatchNorm1d -> ReLU blocks) with an evidential Dirichlet head (docs/method.md §1,
§8 Adult)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn

from resfl_lightning.losses.evidential import dirichlet_alpha


class TabularOutput(NamedTuple):
    """features: penultimate h (B, hidden[-1]) fed to the adversary; logits (B, C); alpha = 1 + softplus(logits)."""

    features: torch.Tensor
    logits: torch.Tensor
    alpha: torch.Tensor


class TabularNet(nn.Module):
    """MLP hidden[0]-...-hidden[-1] with BatchNorm1d and ReLU, then a linear layer to Dirichlet logits."""

    def __init__(self, num_features: int, hidden: Sequence[int] = (256, 128, 64), num_classes: int = 2) -> None:
        super().__init__()
        hidden = tuple(int(h) for h in hidden)
        if num_features < 1:
            raise ValueError(f"TabularNet: num_features must be >= 1, got {num_features}")
        if not hidden or min(hidden) < 1:
            raise ValueError(f"TabularNet: model.hidden must be a non-empty list of positive sizes, got {list(hidden)}")
        if num_classes < 2:
            raise ValueError(f"TabularNet: num_classes must be >= 2 (a Dirichlet over outcomes), got {num_classes}")
        self.num_features, self.hidden, self.num_classes = num_features, hidden, num_classes
        blocks: list[nn.Module] = []
        width = num_features
        for h in hidden:
            blocks += [nn.Linear(width, h), nn.BatchNorm1d(h), nn.ReLU(inplace=True)]
            width = h
        self.body = nn.Sequential(*blocks)
        self.head = nn.Linear(width, num_classes)

    @property
    def feature_dim(self) -> int:
        return self.hidden[-1]

    @property
    def head_parameters(self) -> list[nn.Parameter]:
        """The classifier layer: the default parameter subset of the curvature term."""
        return list(self.head.parameters())

    def forward(self, x: torch.Tensor) -> TabularOutput:
        if x.dim() != 2 or x.shape[1] != self.num_features:
            raise ValueError(f"TabularNet expects inputs of shape (B, {self.num_features}), got {tuple(x.shape)}")
        h = self.body(x)
        logits = self.head(h)
        return TabularOutput(features=h, logits=logits, alpha=dirichlet_alpha(logits))
