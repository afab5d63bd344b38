"""Equalized-odds difference for detection (docs/method.md §6, data poisoning): EOD = |TPR_p - TPR_u| + |FPR_p - FPR_u|.

Detection has no per-group negatives, so FPR needs a reading **(ours)**, taken at the image level:
  an image "of group g" is one that contains at least one ground-truth person of group g; it counts as a false
  positive for g when it has at least one detection (score >= tau) left unmatched by the fairness matching protocol.
  FPR_g = (# images of group g with a false positive) / (# images of group g).
TPR_g is the fairness-protocol TPR, micro-averaged over persons (metrics/fairness.py::group_counts). The protected
group p is one group; the unprotected side u pools every other known group (or one named group). An image holding
persons of both sides counts for both. Classification uses the usual per-sample TPR / FPR (classification_eod).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from resfl_lightning.metrics.fairness import equalized_odds_difference, match_image_groups

__all__ = ["classification_eod", "detection_eod", "detection_group_rates"]

Pair = tuple[Mapping[str, Tensor], Mapping[str, Tensor]]


def detection_group_rates(
    pairs: Sequence[Pair],
    num_groups: int,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.25,
    group_thresholds: Sequence[float] | None = None,
) -> dict[str, Tensor]:
    """tp, fn: per-group person counts (int64, (G,)); present: (n_images, G) bool, image holds a group-g person;
    has_fp: (n_images,) bool, image has an unmatched detection scoring >= score_threshold.

    group_thresholds (a per-group decision rule, e.g. PrivFairFL-Post's): a person of group g counts as found when
    its matched detection scores >= group_thresholds[g]; the matching then runs over every detection (greedy by
    score, so thresholds keep a prefix of it) and score_threshold applies to the unmatched ones (false positives)."""
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    if group_thresholds is not None and len(group_thresholds) != num_groups:
        raise ValueError(f"group_thresholds has {len(group_thresholds)} entries, expected {num_groups}")
    per_group = None if group_thresholds is None else torch.as_tensor(group_thresholds, dtype=torch.float64)
    tp = torch.zeros(num_groups, dtype=torch.long)
    fn = torch.zeros(num_groups, dtype=torch.long)
    present_rows, fp_rows = [], []
    match_at = score_threshold if per_group is None else 0.0
    for idx, (pred, gt) in enumerate(pairs):
        groups, pred_to_gt, matched = match_image_groups((pred, gt), idx, num_groups, iou_threshold, match_at)
        known = groups >= 0
        scores = pred["scores"].detach().cpu()
        if per_group is not None:
            gt_score = torch.full(groups.shape, -math.inf, dtype=torch.float64)
            hit = pred_to_gt >= 0
            gt_score[pred_to_gt[hit]] = scores[hit].double()
            matched = known & (gt_score >= per_group[groups.clamp_min(0)])
        tp += torch.bincount(groups[known & matched], minlength=num_groups)
        fn += torch.bincount(groups[known & ~matched], minlength=num_groups)
        present = torch.zeros(num_groups, dtype=torch.bool)
        present[groups[known].unique()] = True
        has_fp = bool(((scores >= score_threshold) & (pred_to_gt < 0)).any())
        present_rows.append(present)
        fp_rows.append(has_fp)
    present_all = torch.stack(present_rows) if present_rows else torch.zeros(0, num_groups, dtype=torch.bool)
    return {"tp": tp, "fn": fn, "present": present_all, "has_fp": torch.tensor(fp_rows, dtype=torch.bool)}


def _rate(num: int, den: int, what: str) -> float:
    if den == 0:
        raise ValueError(f"{what} is undefined: no ground truth for that side")
    return num / den


def _sides(num_groups: int, protected_group: int, unprotected_group: int | None) -> tuple[Tensor, Tensor]:
    if not 0 <= protected_group < num_groups:
        raise ValueError(f"protected_group must lie in 0..{num_groups - 1}, got {protected_group}")
    if unprotected_group is not None and (unprotected_group == protected_group
                                          or not 0 <= unprotected_group < num_groups):
        raise ValueError(f"unprotected_group must be another group in 0..{num_groups - 1}, got {unprotected_group}")
    p = torch.arange(num_groups) == protected_group
    u = ~p if unprotected_group is None else torch.arange(num_groups) == unprotected_group
    return p, u


def _result(tpr_p: float, tpr_u: float, fpr_p: float, fpr_u: float) -> dict[str, float]:
    return {"eod": equalized_odds_difference(tpr_p, tpr_u, fpr_p, fpr_u), "tpr_protected": tpr_p,
            "tpr_unprotected": tpr_u, "fpr_protected": fpr_p, "fpr_unprotected": fpr_u}


def classification_eod(y_true: Any, y_pred: Any, groups: Any, num_groups: int, protected_group: int,
                       unprotected_group: int | None = None) -> dict[str, float]:
    """EOD for binary classification: TPR = P(yhat=1 | y=1, side), FPR = P(yhat=1 | y=0, side), samples pooled per side
    (group -1 excluded). Same keys as detection_eod."""
    def arr(x: Any) -> np.ndarray:
        return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x).reshape(-1).astype(np.int64)

    yt, yp, g = arr(y_true), arr(y_pred), arr(groups)
    if not yt.size == yp.size == g.size:
        raise ValueError(f"y_true, y_pred, groups lengths differ: {yt.size}, {yp.size}, {g.size}")
    if not (np.isin(yt, (0, 1)).all() and np.isin(yp, (0, 1)).all()):
        raise ValueError("classification_eod: y_true and y_pred must be binary (0/1)")
    p, u = (s.numpy() for s in _sides(num_groups, protected_group, unprotected_group))
    known = (g >= 0) & (g < num_groups)
    in_p = known & p[np.clip(g, 0, num_groups - 1)]
    in_u = known & u[np.clip(g, 0, num_groups - 1)]
    pos, neg = yt == 1, yt == 0
    return _result(_rate(int(yp[in_p & pos].sum()), int((in_p & pos).sum()), "TPR of the protected group"),
                   _rate(int(yp[in_u & pos].sum()), int((in_u & pos).sum()), "TPR of the unprotected groups"),
                   _rate(int(yp[in_p & neg].sum()), int((in_p & neg).sum()), "FPR of the protected group"),
                   _rate(int(yp[in_u & neg].sum()), int((in_u & neg).sum()), "FPR of the unprotected groups"))


def detection_eod(
    pairs: Sequence[Pair],
    num_groups: int,
    protected_group: int,
    unprotected_group: int | None = None,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.25,
    group_thresholds: Sequence[float] | None = None,
) -> dict[str, float]:
    """EOD between `protected_group` and the pooled other groups (or `unprotected_group`), with its four rates
    (group_thresholds: a per-group decision rule, see detection_group_rates).

    Returns eod, tpr_protected, tpr_unprotected, fpr_protected, fpr_unprotected. Raises ValueError when either side
    has no person in the data (the rates would be undefined).
    """
    p, u = _sides(num_groups, protected_group, unprotected_group)
    c = detection_group_rates(pairs, num_groups, iou_threshold, score_threshold, group_thresholds)
    persons = c["tp"] + c["fn"]
    tpr_p = _rate(int(c["tp"][p].sum()), int(persons[p].sum()), f"TPR of protected group {protected_group}")
    tpr_u = _rate(int(c["tp"][u].sum()), int(persons[u].sum()), "TPR of the unprotected groups")
    # An image counts once per side, however many persons (or unprotected groups) it holds.
    img_p, img_u = c["present"][:, p].any(1), c["present"][:, u].any(1)
    fpr_p = _rate(int((img_p & c["has_fp"]).sum()), int(img_p.sum()), f"FPR of protected group {protected_group}")
    fpr_u = _rate(int((img_u & c["has_fp"]).sum()), int(img_u.sum()), "FPR of the unprotected groups")
    return _result(tpr_p, tpr_u, fpr_p, fpr_u)
