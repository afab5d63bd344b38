"""Kamiran–Calders reweighing (Kamiran & Calders, KAIS 2012): per-sample weights w(a, y) = P(a) P(y) / P(a, y) under
which the sensitive group a and the label y are independent; FairFed's optional local debiasing
(`algorithm.local_reweighting=true`, docs/method.md §5a).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def kamiran_calders_weights(groups: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """float64 (n,) weights of the rows (groups, labels), estimated on these rows alone.

    Rows of unknown group (-1) weigh 1 and take no part in the estimate. A (a, y) cell no row holds (e.g. a group
    without positives) carries no mass, so the known rows' weights are rescaled to sum to their count; with every
    cell present the rescale is exactly 1 (Σ w = n) and the weighted P(a, y) equals P(a) P(y)."""
    groups, labels = torch.as_tensor(groups).long().reshape(-1), torch.as_tensor(labels).long().reshape(-1)
    if groups.shape != labels.shape:
        raise ValueError(f"groups {tuple(groups.shape)} and labels {tuple(labels.shape)} must describe the same rows")
    if labels.numel() and int(labels.min()) < 0:
        raise ValueError("labels must be >= 0")
    w = torch.ones(groups.numel(), dtype=torch.float64)
    known = groups >= 0
    n = int(known.sum())
    if n == 0:
        return w
    a, y = groups[known], labels[known]
    num_y = int(y.max()) + 1
    joint = torch.bincount(a * num_y + y, minlength=(int(a.max()) + 1) * num_y).double().reshape(-1, num_y) / n
    p_a, p_y = joint.sum(1, keepdim=True), joint.sum(0, keepdim=True)
    cell = (p_a * p_y / joint.clamp_min(1e-300))[a, y]  # only present cells are ever indexed
    w[known] = cell * (n / cell.sum())
    return w


def split_row_weights(groups: torch.Tensor, labels: torch.Tensor, splits: Sequence[np.ndarray]) -> torch.Tensor:
    """float32 (N,) weights over the whole row index space: each split's rows (a client's training split) weighted
    on that split alone; rows in no split (validation, test, the attack reserve) weigh 1."""
    w = torch.ones(len(labels), dtype=torch.float64)
    seen = torch.zeros(len(labels), dtype=torch.bool)
    for rows in splits:
        rows = torch.as_tensor(np.asarray(rows, dtype=np.int64))
        if seen[rows].any() or rows.unique().numel() != rows.numel():
            raise ValueError("split_row_weights: a row lies in two splits, so its weight would be ambiguous")
        seen[rows] = True
        w[rows] = kamiran_calders_weights(groups[rows], labels[rows])
    return w.float()
