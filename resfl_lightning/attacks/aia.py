"""Attribute inference probe (SPEC §7): a two-layer MLP predicting the sensitive group from feature vectors.

Used for both the representation AIA (ROIAlign neck features of matched persons) and the update-aware AIA
(vectors from `update_features.py`). Deterministic from the seed and leaves the global torch RNG untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from sklearn.metrics import f1_score
from sklearn.model_selection import train_test_split
from torch import nn


class AttributeProbe(nn.Module):
    """Linear -> ReLU -> Dropout -> Linear (SPEC §1/§7: hidden 128, dropout 0.1)."""

    def __init__(self, in_dim: int, num_groups: int, hidden: int = 128, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, num_groups)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _as_arrays(features: Any, groups: Any, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    x = features.detach().cpu().numpy() if hasattr(features, "detach") else np.asarray(features)
    g = groups.detach().cpu().numpy() if hasattr(groups, "detach") else np.asarray(groups)
    x = x.astype(np.float32)
    if x.ndim != 2:
        raise ValueError(f"features: expected (n, d), got shape {tuple(x.shape)}")
    g = g.reshape(-1)
    if g.shape[0] != x.shape[0]:
        raise ValueError(f"groups: {g.shape[0]} labels for {x.shape[0]} feature rows")
    if not np.all(np.equal(np.mod(g, 1), 0)):
        raise ValueError("groups: labels must be integers")
    g = g.astype(np.int64)
    bad = np.flatnonzero((g < -1) | (g >= num_groups))
    if bad.size:
        raise ValueError(f"groups: rows {bad[:10].tolist()} outside 0..{num_groups - 1} (or -1 = unknown)")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"features: non-finite values in rows {np.flatnonzero(~np.isfinite(x).all(1))[:10].tolist()}")
    keep = g >= 0  # unknown group (-1) cannot be a probe target
    return x[keep], g[keep]


def _split(y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """70/10/20 train/val/test indices, stratified by group when every group has enough samples."""
    idx = np.arange(y.shape[0])
    try:
        rest, test = train_test_split(idx, test_size=0.2, stratify=y, random_state=seed)
        train, val = train_test_split(rest, test_size=0.125, stratify=y[rest], random_state=seed)
        return train, val, test, True
    except ValueError:
        # A group with too few samples to appear in every split: fall back to a plain seeded shuffle split.
        rest, test = train_test_split(idx, test_size=0.2, random_state=seed)
        train, val = train_test_split(rest, test_size=0.125, random_state=seed)
        return train, val, test, False


def train_attribute_probe(
    features: Any,
    groups: Any,
    num_groups: int,
    seed: int,
    hidden: int = 128,
    dropout: float = 0.1,
    lr: float = 1e-3,
    epochs: int = 10,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Train the MLP probe with Adam on a 70/10/20 split, keep the best-validation-epoch weights, score the test split.

    Returns top1, macro_f1 (sklearn, over groups present in test labels or predictions), chance_rate (majority-class
    rate of the test split), n_train/n_val/n_test, best_epoch, stratified, and the arrays y_test / y_pred.
    Features are standardised with train-split statistics. Rows with group -1 are excluded.
    """
    if num_groups < 2:
        raise ValueError(f"num_groups must be >= 2, got {num_groups}")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs}, {batch_size}")
    x, y = _as_arrays(features, groups, num_groups)
    if x.shape[0] < 10:
        raise ValueError(f"need at least 10 labelled samples for a 70/10/20 split, got {x.shape[0]}")
    train, val, test, stratified = _split(y, seed)

    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std[std < 1e-12] = 1.0  # constant features stay constant (0) instead of dividing by zero
    xt = torch.from_numpy((x - mean) / std)
    yt = torch.from_numpy(y)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probe = AttributeProbe(x.shape[1], num_groups, hidden=hidden, dropout=dropout)
        opt = torch.optim.Adam(probe.parameters(), lr=lr)
        loss_fn = nn.CrossEntropyLoss()
        shuffle = torch.Generator().manual_seed(seed)
        train_t = torch.from_numpy(train)
        best = (-1.0, float("inf"))  # (val accuracy, val loss): higher accuracy wins, lower loss breaks ties
        best_state = {k: v.clone() for k, v in probe.state_dict().items()}
        best_epoch = 0
        for epoch in range(1, epochs + 1):
            probe.train()
            order = train_t[torch.randperm(train_t.numel(), generator=shuffle)]
            for start in range(0, order.numel(), batch_size):
                b = order[start:start + batch_size]
                opt.zero_grad(set_to_none=True)
                loss_fn(probe(xt[b]), yt[b]).backward()
                opt.step()
            probe.eval()
            with torch.no_grad():
                logits = probe(xt[val])
                val_acc = float((logits.argmax(1) == yt[val]).float().mean())
                val_loss = float(loss_fn(logits, yt[val]))
            if val_acc > best[0] or (val_acc == best[0] and val_loss < best[1]):
                best = (val_acc, val_loss)
                best_state = {k: v.clone() for k, v in probe.state_dict().items()}
                best_epoch = epoch
        probe.load_state_dict(best_state)
        probe.eval()
        with torch.no_grad():
            y_pred = probe(xt[test]).argmax(1).numpy()

    y_test = y[test]
    counts = np.bincount(y_test, minlength=num_groups)
    return {
        "top1": float(np.mean(y_pred == y_test)),
        "macro_f1": float(f1_score(y_test, y_pred, average="macro", zero_division=0)),
        "chance_rate": float(counts.max() / y_test.size),
        "n_train": int(train.size),
        "n_val": int(val.size),
        "n_test": int(test.size),
        "best_epoch": best_epoch,
        "stratified": stratified,
        "y_test": y_test,
        "y_pred": y_pred,
    }


def aia_success_rate(result: dict[str, Any]) -> float:
    """AIA SR entering the Privacy Score (SPEC §6): the probe's top-1 test accuracy."""
    return float(result["top1"])
