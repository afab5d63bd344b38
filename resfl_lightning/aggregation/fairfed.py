"""FairFed (Ezzeldin et al., AAAI 2023): fairness-aware server weights from client-reported counts
(docs/method.md §5a).

Each round, before local training, every client evaluates the global model on its validation split and reports
per-group true-positive and positive counts plus its (correct, total) counts (nothing per sample). The server computes
the global metric from the summed counts (= the metric on the union of the data) and each client's from its own:

    Delta_k = |F_global - F_k| if client k holds every group the federation holds, else |Acc_global - Acc_k|
    omega_k <- omega_k - beta (Delta_k - mean_j Delta_j),  omega_k^0 = n_k / n,  omega <- max(omega, 0)
    weights = omega / sum(omega)   (all omega 0: back to n_k / n)

F with two groups is the signed EOD TPR_0 - TPR_1; with more, the non-strict analogue mean_g |TPR_g - TPR| over
the groups (TPR: all groups pooled). "Holds a group" = has positives of it (EOD conditions on Y = 1). For detection
the accuracy is the share of persons found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from resfl_lightning.aggregation.base import StreamingRule
from resfl_lightning.types import ClientReport

WEIGHTS_KEY = "fairfed_weights"


def group_metric(tp, positives, groups: np.ndarray) -> float:
    """F over `groups` (indices with positives): the signed EOD TPR_0 - TPR_1 of two groups, or
    mean_g |TPR_g - TPR| of more (0 with fewer than two)."""
    tp, positives = np.asarray(tp, dtype=float)[groups], np.asarray(positives, dtype=float)[groups]
    if groups.size < 2:
        return 0.0
    tpr = tp / positives
    if groups.size == 2:
        return float(tpr[0] - tpr[1])
    return float(np.mean(np.abs(tpr - tp.sum() / positives.sum())))


def fairness_gaps(stats: dict[int, tuple]) -> dict[int, float]:
    """Delta_k per client from (TP per group, positives per group, (correct, total)) counts."""
    tp = sum(np.asarray(s[0], dtype=float) for s in stats.values())
    pos = sum(np.asarray(s[1], dtype=float) for s in stats.values())
    correct, total = sum(np.asarray(s[2], dtype=float) for s in stats.values())
    groups = np.flatnonzero(pos > 0)
    f_global, acc_global = group_metric(tp, pos, groups), correct / max(total, 1.0)
    gaps = {}
    for k, (t, p, acc) in stats.items():
        if groups.size >= 2 and (np.asarray(p, dtype=float)[groups] > 0).all():
            gaps[k] = abs(f_global - group_metric(t, p, groups))
        else:  # a client lacking a group has no local F: the accuracy gap instead
            gaps[k] = abs(acc_global - float(acc[0]) / max(float(acc[1]), 1.0))
    return gaps


def fairfed_update(previous: dict[int, float], gaps: dict[int, float], beta: float,
                   initial: dict[int, float]) -> dict[int, float]:
    """One omega step over the clients in `gaps` (unnormalised, clamped at 0); all zero: `initial` (n_k / n)."""
    ids = sorted(gaps)
    delta = np.array([gaps[k] for k in ids])
    w = np.clip(np.array([previous[k] for k in ids]) - beta * (delta - delta.mean()), 0.0, None)
    if not w.sum() > 0:
        w = np.array([initial[k] for k in ids])
    return dict(zip(ids, w.tolist()))


@dataclass
class FairFed(StreamingRule):
    """Server weights adapted to each client's fairness gap (fairness budget beta_F)."""

    beta: float = 1.0
    needs_group_stats = True
    uses_client_evaluation = False  # its weights come from the group statistics of theta_G (prepare)
    weights_now: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.beta < 0:
            raise ValueError(f"aggregation.beta must be >= 0, got {self.beta}")

    def prepare(self, state, stats: dict[int, tuple], num_samples: dict[int, int]):
        """Fold this round's counts into the omega kept in `state.extra`; returns the new state."""
        if not stats:  # every sampled client failed its statistics: no weights this round (all are dropped)
            self.weights_now = {}
            return state
        stored = state.extra.get(WEIGHTS_KEY)
        total = sum(num_samples.values())
        initial = {k: num_samples[k] / total for k in stats}  # FairFed starts from n_k / n
        previous = dict(initial)
        if stored is not None:
            previous = {k: float(stored[k]) if k < stored.numel() and not math.isnan(float(stored[k])) else v
                        for k, v in previous.items()}
        omega = fairfed_update(previous, fairness_gaps(stats), self.beta, initial)
        norm = sum(omega.values())
        self.weights_now = {k: w / norm for k, w in omega.items()}
        size = max(max(num_samples) + 1, 0 if stored is None else stored.numel())
        table = torch.full((size,), math.nan, dtype=torch.float64)
        if stored is not None:
            table[: stored.numel()] = stored
        for k, w in omega.items():
            table[k] = w
        return replace(state, extra={**state.extra, WEIGHTS_KEY: table})

    def score(self, report: ClientReport) -> float:
        if report.client_id not in self.weights_now:
            raise RuntimeError(f"FairFed has no weight for client {report.client_id}: prepare() was not called "
                               "with its group statistics this round")
        w = self.weights_now[report.client_id]
        return math.log(w) if w > 0 else -math.inf
