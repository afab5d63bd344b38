"""FairFed (Ezzeldin et al., AAAI 2023): fairness-aware server weights from client-reported group statistics.

Each round, before local training, every client evaluates the global model on its validation split and reports
per-group true-positive and positive counts (the statistics FairFed aggregates; nothing per sample). The server
computes the global fairness metric from the summed counts and each client's local metric from its own, and
moves weight towards clients whose local fairness is closer to the global one:

    Delta_k = |F_global - F_k|,   w_k <- w_k - beta_F (Delta_k - mean_j Delta_j),   w <- max(w, 0) / sum

starting from w_k = n_k / n. F is the equal-opportunity difference (max - min group TPR), the metric this project
reports. A group absent from a client's split takes the global TPR there (**our reading**: the paper assumes every
client sees every group), so a missing group neither helps nor hurts that client's gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from resfl_lightning.aggregation.base import StreamingRule
from resfl_lightning.types import ClientReport

WEIGHTS_KEY = "fairfed_weights"


def eop_gap(tp: np.ndarray, positives: np.ndarray, fill: np.ndarray | None = None) -> float:
    """max_g TPR_g - min_g TPR_g over groups with positives (or filled from `fill` where a group has none)."""
    tp, positives = np.asarray(tp, dtype=float), np.asarray(positives, dtype=float)
    tpr = np.divide(tp, positives, out=np.full_like(tp, np.nan), where=positives > 0)
    if fill is not None:
        tpr = np.where(np.isnan(tpr), fill, tpr)
    present = tpr[~np.isnan(tpr)]
    return float(present.max() - present.min()) if present.size >= 2 else 0.0


def fairness_gaps(stats: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, float]:
    """Delta_k = |F_global - F_k| per client from per-group (TP, positives) counts."""
    tp = sum(np.asarray(t, dtype=float) for t, _ in stats.values())
    pos = sum(np.asarray(p, dtype=float) for _, p in stats.values())
    global_tpr = np.divide(tp, pos, out=np.full_like(tp, np.nan), where=pos > 0)
    f_global = eop_gap(tp, pos)
    return {k: abs(f_global - eop_gap(t, p, fill=global_tpr)) for k, (t, p) in stats.items()}


def fairfed_update(previous: dict[int, float], gaps: dict[int, float], beta: float) -> dict[int, float]:
    """One FairFed weight step over the clients in `gaps`; uniform if every weight is driven to zero."""
    ids = sorted(gaps)
    delta = np.array([gaps[k] for k in ids])
    w = np.array([previous[k] for k in ids]) - beta * (delta - delta.mean())
    w = np.clip(w, 0.0, None)
    w = w / w.sum() if w.sum() > 0 else np.full(len(ids), 1.0 / len(ids))
    return dict(zip(ids, w.tolist()))


@dataclass
class FairFed(StreamingRule):
    """Server weights adapted to each client's fairness gap (fairness budget beta_F)."""

    beta: float = 1.0
    needs_group_stats = True
    weights_now: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.beta < 0:
            raise ValueError(f"aggregation.beta must be >= 0, got {self.beta}")

    def prepare(self, state, stats: dict[int, tuple[np.ndarray, np.ndarray]], num_samples: dict[int, int]):
        """Fold this round's statistics into the weights kept in `state.extra`; returns the new state."""
        if not stats:  # every sampled client failed its statistics: no weights this round (all are dropped)
            self.weights_now = {}
            return state
        stored = state.extra.get(WEIGHTS_KEY)
        total = sum(num_samples.values())
        previous = {k: num_samples[k] / total for k in stats}  # FairFed starts from n_k / n
        if stored is not None:
            previous = {k: float(stored[k]) if not math.isnan(float(stored[k])) else v for k, v in previous.items()}
        self.weights_now = fairfed_update(previous, fairness_gaps(stats), self.beta)
        size = max(max(num_samples) + 1, 0 if stored is None else stored.numel())
        table = torch.full((size,), math.nan, dtype=torch.float64)
        if stored is not None:
            table[: stored.numel()] = stored
        for k, w in self.weights_now.items():
            table[k] = w
        return replace(state, extra={**state.extra, WEIGHTS_KEY: table})

    def score(self, report: ClientReport) -> float:
        if report.client_id not in self.weights_now:
            raise RuntimeError(f"FairFed has no weight for client {report.client_id}: prepare() was not called "
                               "with its group statistics this round")
        w = self.weights_now[report.client_id]
        return math.log(w) if w > 0 else -math.inf
