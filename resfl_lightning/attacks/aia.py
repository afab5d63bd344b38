"""Attribute inference probe (docs/method.md §7): a two-layer MLP predicting the sensitive group from feature vectors.

Used for both the representation AIA (ROIAlign neck features of matched persons) and the update-aware AIA
(vectors from `update_features.py`). The probe trains class-balanced (cross-entropy weighted by inverse group
frequency) and keeps the epoch with the best validation balanced accuracy, so a minority group counts as much as the
majority. Every score set carries balanced accuracy (the AIA SR of the Privacy Score), top-1, macro-F1 and both chance
rates. Deterministic from the seed and leaves the global torch RNG untouched.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score
from sklearn.model_selection import train_test_split
from sklearn.utils.class_weight import compute_class_weight
from torch import nn

MIN_TRAIN_TEST_SAMPLES = 8  # train_test_attribute_probe: enough to hold out one validation row per 8


class AttributeProbe(nn.Module):
    """Linear -> ReLU -> Dropout -> Linear (docs/method.md §1, §7: hidden 128, dropout 0.1)."""

    def __init__(self, in_dim: int, num_groups: int, hidden: int = 128, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, num_groups)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def probe_scores(y_true: Any, y_pred: Any, num_groups: int) -> dict[str, float]:
    """Scores of group predictions (scikit-learn): balanced_accuracy, top1, macro_f1, and the two chance rates.

    chance_uniform = 1/G over the G groups present in y_true (what balanced accuracy gives a constant or random
    guess); chance_majority = share of the most frequent group in y_true (what top-1 gives a majority guess).
    """
    y_true = np.asarray(y_true, np.int64).reshape(-1)
    y_pred = np.asarray(y_pred, np.int64).reshape(-1)
    if y_true.size == 0 or y_true.shape != y_pred.shape:
        raise ValueError(f"probe_scores: need equal, non-empty label arrays, got {y_true.shape} and {y_pred.shape}")
    counts = np.bincount(y_true, minlength=num_groups)
    present = np.flatnonzero(counts)
    with warnings.catch_warnings():  # predicting a group absent from y_true is legitimate here
        warnings.simplefilter("ignore", UserWarning)
        balanced = balanced_accuracy_score(y_true, y_pred)  # mean recall over the groups present in y_true
    return {
        "balanced_accuracy": float(balanced),
        "top1": float(np.mean(y_pred == y_true)),
        "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
        "chance_uniform": 1.0 / present.size,
        "chance_majority": float(counts.max() / y_true.size),
    }


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


def _split(y: np.ndarray, seed: int, test_size: float) -> tuple[np.ndarray, np.ndarray, bool]:
    """Seeded (rest, held-out) index split, stratified by group when every group has enough samples."""
    idx = np.arange(y.shape[0])
    try:
        rest, held = train_test_split(idx, test_size=test_size, stratify=y, random_state=seed)
        return rest, held, True
    except ValueError:  # a group too rare to appear on both sides: plain seeded shuffle split
        rest, held = train_test_split(idx, test_size=test_size, random_state=seed)
        return rest, held, False


def _fit(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, num_groups: int,
         seed: int, hidden: int, dropout: float, lr: float, epochs: int, batch_size: int):
    """Class-balanced Adam training; returns predict(x) -> labels with the best-validation-epoch weights."""
    mean = x_train.mean(axis=0)
    std = x_train.std(axis=0)
    std[std < 1e-12] = 1.0  # constant features stay constant (0) instead of dividing by zero

    def standardise(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((x - mean) / std).astype(np.float32))

    present = np.unique(y_train)
    weights = np.zeros(num_groups, np.float32)
    weights[present] = compute_class_weight("balanced", classes=present, y=y_train)
    xt, yt, xv = standardise(x_train), torch.from_numpy(y_train), standardise(x_val)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        probe = AttributeProbe(x_train.shape[1], num_groups, hidden=hidden, dropout=dropout)
        opt = torch.optim.Adam(probe.parameters(), lr=lr)
        loss_fn = nn.CrossEntropyLoss(weight=torch.from_numpy(weights))
        shuffle = torch.Generator().manual_seed(seed)
        best, best_epoch = (-1.0, float("inf")), 0  # (val balanced accuracy, val loss)
        best_state = {k: v.clone() for k, v in probe.state_dict().items()}
        for epoch in range(1, epochs + 1):
            probe.train()
            order = torch.randperm(len(yt), generator=shuffle)
            for start in range(0, len(order), batch_size):
                b = order[start:start + batch_size]
                opt.zero_grad(set_to_none=True)
                loss_fn(probe(xt[b]), yt[b]).backward()
                opt.step()
            probe.eval()
            with torch.no_grad():
                logits = probe(xv)
                val_ba = probe_scores(y_val, logits.argmax(1).numpy(), num_groups)["balanced_accuracy"]
                val_loss = float(loss_fn(logits, torch.from_numpy(y_val)))
            if val_ba > best[0] or (val_ba == best[0] and val_loss < best[1]):
                best, best_epoch = (val_ba, val_loss), epoch
                best_state = {k: v.clone() for k, v in probe.state_dict().items()}
        probe.load_state_dict(best_state)
        probe.eval()

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return probe(standardise(x)).argmax(1).numpy()

    return predict, best_epoch


def _check_hparams(num_groups: int, epochs: int, batch_size: int) -> None:
    if num_groups < 2:
        raise ValueError(f"num_groups must be >= 2, got {num_groups}")
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs}, {batch_size}")


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
    """Train the MLP probe on a 70/10/20 train/val/test split of one labelled set and score the test split.

    Returns probe_scores() (balanced_accuracy, top1, macro_f1, chance_uniform, chance_majority), n_train/n_val/n_test,
    best_epoch, stratified, and the arrays y_test / y_pred. Features are standardised with train-split statistics.
    Rows with group -1 are excluded.
    """
    _check_hparams(num_groups, epochs, batch_size)
    x, y = _as_arrays(features, groups, num_groups)
    if x.shape[0] < 10:
        raise ValueError(f"need at least 10 labelled samples for a 70/10/20 split, got {x.shape[0]}")
    rest, test, strat_a = _split(y, seed, 0.2)
    train_pos, val_pos, strat_b = _split(y[rest], seed, 0.125)
    train, val = rest[train_pos], rest[val_pos]
    predict, best_epoch = _fit(x[train], y[train], x[val], y[val], num_groups, seed, hidden, dropout, lr, epochs,
                               batch_size)
    y_pred = predict(x[test])
    return {**probe_scores(y[test], y_pred, num_groups), "n_train": int(train.size), "n_val": int(val.size),
            "n_test": int(test.size), "best_epoch": best_epoch, "stratified": strat_a and strat_b,
            "y_test": y[test], "y_pred": y_pred}


def train_test_attribute_probe(
    train_features: Any,
    train_groups: Any,
    test_features: Any,
    test_groups: Any,
    num_groups: int,
    seed: int,
    hidden: int = 128,
    dropout: float = 0.1,
    lr: float = 1e-3,
    epochs: int = 10,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Train on one labelled set (cut 7:1 into train/val, as in 70/10/20) and score a disjoint test set.

    The test rows are used only for the final predictions: neither their features nor their labels enter the
    standardisation, the fit or the epoch choice. Same result keys as train_attribute_probe().
    """
    _check_hparams(num_groups, epochs, batch_size)
    x, y = _as_arrays(train_features, train_groups, num_groups)
    xt, yt = _as_arrays(test_features, test_groups, num_groups)
    if x.shape[0] < MIN_TRAIN_TEST_SAMPLES or xt.shape[0] < 1:
        raise ValueError(f"need >= {MIN_TRAIN_TEST_SAMPLES} training and >= 1 test samples, got {x.shape[0]} and "
                         f"{xt.shape[0]}")
    if x.shape[1] != xt.shape[1]:
        raise ValueError(f"train features have {x.shape[1]} columns, test features {xt.shape[1]}")
    train, val, stratified = _split(y, seed, 0.125)
    predict, best_epoch = _fit(x[train], y[train], x[val], y[val], num_groups, seed, hidden, dropout, lr, epochs,
                               batch_size)
    y_pred = predict(xt)
    return {**probe_scores(yt, y_pred, num_groups), "n_train": int(train.size), "n_val": int(val.size),
            "n_test": int(xt.shape[0]), "best_epoch": best_epoch, "stratified": stratified, "y_test": yt,
            "y_pred": y_pred}


def used_ground_truth_fallback(boxes: str, source: str) -> bool:
    """True when the representation AIA was asked for matched boxes (attack.aia.boxes=matched) but probed the
    ground-truth person boxes instead, because fewer than attack.aia.min_matched persons were matched
    (attacks/outputs.py::representation_features): its score then measures the features, not what the model finds."""
    return boxes == "matched" and source == "ground_truth"


def aia_success_rate(result: dict[str, Any]) -> float:
    """AIA SR entering the Privacy Score (docs/method.md §6, RESFL A.4.1): the probe's balanced test accuracy."""
    return float(result["balanced_accuracy"])
