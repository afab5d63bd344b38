"""Group fairness metrics (docs/method.md §6): per-group TPR from the matching protocol, DI, Delta-EOP, EOD, scores.

Detection TPRs are micro-averaged over every ground-truth person of a group (never averaged per image).
Classification metrics take binary y_true / y_pred and an integer sensitive attribute (-1 = unknown, excluded).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from resfl_lightning.metrics.matching import match_pred_gt

__all__ = [
    "abs_one_minus_di",
    "classification_fairness",
    "detection_fairness",
    "disparate_impact",
    "eo_gap",
    "equal_opportunity_difference",
    "equalized_odds_difference",
    "fairness_score",
    "group_counts",
    "group_positive_rates",
    "group_tpr",
    "privacy_score",
]

Pair = tuple[Mapping[str, Tensor], Mapping[str, Tensor]]


def group_counts(
    pairs: Sequence[Pair],
    num_groups: int,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.25,
) -> tuple[Tensor, Tensor]:
    """Per-group TP and FN counts (int64, (num_groups,)) over all ground-truth persons of every image.

    Matching runs over all ground truth of an image (unknown-group persons included, so they still consume
    predictions); only persons with a group in 0..num_groups-1 are counted. Predictions below score_threshold
    are ignored.
    """
    if num_groups < 1:
        raise ValueError(f"num_groups must be >= 1, got {num_groups}")
    tp = torch.zeros(num_groups, dtype=torch.long)
    fn = torch.zeros(num_groups, dtype=torch.long)
    for idx, pair in enumerate(pairs):
        groups, _, matched = match_image_groups(pair, idx, num_groups, iou_threshold, score_threshold)
        known = groups >= 0
        tp += torch.bincount(groups[known & matched], minlength=num_groups)
        fn += torch.bincount(groups[known & ~matched], minlength=num_groups)
    return tp, fn


def match_image_groups(pair: Pair, idx: int, num_groups: int, iou_threshold: float,
                       score_threshold: float) -> tuple[Tensor, Tensor, Tensor]:
    """Validated gt groups of image `idx` plus its fairness matching (pred_to_gt, gt_matched); errors name the image."""
    pred, gt = pair
    if "groups" not in gt:
        raise KeyError(f"image {idx}: ground-truth dict lacks key 'groups' (has {sorted(gt)})")
    groups = gt["groups"].detach().cpu().long()
    if groups.ndim != 1 or groups.shape[0] != gt["boxes"].shape[0]:
        expected = gt["boxes"].shape[0]
        raise ValueError(f"image {idx}: gt['groups'] has shape {tuple(groups.shape)}, expected ({expected},)")
    if groups.numel() and (groups.min() < -1 or groups.max() >= num_groups):
        raise ValueError(f"image {idx}: gt['groups'] must lie in -1..{num_groups - 1}, got {groups.tolist()}")
    try:
        pred_to_gt, matched = match_pred_gt(pred, gt, iou_threshold, score_threshold)
    except (KeyError, ValueError) as err:
        raise type(err)(f"image {idx}: {err}") from err
    return groups, pred_to_gt, matched


def group_tpr(tp: Tensor, fn: Tensor) -> Tensor:
    """TPR_g = TP_g / (TP_g + FN_g) as float64; NaN for groups without ground-truth persons."""
    if tp.shape != fn.shape:
        raise ValueError(f"tp and fn must have the same shape, got {tuple(tp.shape)} and {tuple(fn.shape)}")
    if (tp < 0).any() or (fn < 0).any():
        raise ValueError("tp and fn must be non-negative counts")
    total = (tp + fn).double()
    return torch.where(total > 0, tp.double() / total.clamp_min(1), torch.full_like(total, math.nan))


def _present_rates(rates: Any, name: str = "rates") -> np.ndarray:
    """Rates of the groups that are present (non-NaN), validated to lie in [0, 1]."""
    arr = np.asarray(rates.detach().cpu() if isinstance(rates, Tensor) else rates, dtype=np.float64).reshape(-1)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        raise ValueError(f"{name}: no group has a defined rate (all NaN or empty)")
    if (arr < 0).any() or (arr > 1).any():
        raise ValueError(f"{name} must lie in [0, 1], got {arr.tolist()}")
    return arr


def disparate_impact(rates: Any) -> float:
    """DI = min_g rate_g / max_g rate_g over present (non-NaN) groups; NaN when every rate is 0 (0/0)."""
    arr = _present_rates(rates)
    top = arr.max()
    return float(arr.min() / top) if top > 0 else math.nan


def abs_one_minus_di(rates: Any) -> float:
    """|1 - DI|, the reported form of disparate impact (0 = parity)."""
    return abs(1.0 - disparate_impact(rates))


def equal_opportunity_difference(rates: Any) -> float:
    """Delta-EOP = max_g TPR_g - min_g TPR_g over present groups."""
    arr = _present_rates(rates)
    return float(arr.max() - arr.min())


def eo_gap(tpr_rates: Any) -> float:
    """CurvFed EO gap: max over group pairs of |TPR_a - TPR_b| (0 with a single present group)."""
    arr = _present_rates(tpr_rates, "tpr_rates")
    return max((abs(float(a - b)) for a, b in itertools.combinations(arr, 2)), default=0.0)


def equalized_odds_difference(tpr_p: float, tpr_u: float, fpr_p: float, fpr_u: float) -> float:
    """EOD = |TPR_p - TPR_u| + |FPR_p - FPR_u| between the protected (p) and unprotected (u) group."""
    for name, val in (("tpr_p", tpr_p), ("tpr_u", tpr_u), ("fpr_p", fpr_p), ("fpr_u", fpr_u)):
        if not 0.0 <= float(val) <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {val}")
    return abs(float(tpr_p) - float(tpr_u)) + abs(float(fpr_p) - float(fpr_u))


def fairness_score(di: float, eop: float) -> float:
    """Fairness Score = (|1 - DI| + Delta-EOP) / 2 (lower is fairer)."""
    if not math.isnan(eop) and eop < 0:
        raise ValueError(f"eop (Delta-EOP) must be >= 0, got {eop}")
    return (abs(1.0 - float(di)) + float(eop)) / 2.0


def privacy_score(mia_sr: float, aia_sr: float) -> float:
    """Privacy Score = (MIA success rate + AIA success rate) / 2."""
    for name, val in (("mia_sr", mia_sr), ("aia_sr", aia_sr)):
        if not 0.0 <= float(val) <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {val}")
    return (float(mia_sr) + float(aia_sr)) / 2.0


def _summary(tpr: dict[int, float], di_rates: np.ndarray, tpr_rates: np.ndarray) -> dict[str, float]:
    di = disparate_impact(di_rates)
    eop = equal_opportunity_difference(tpr_rates)
    out = {f"tpr/{g}": v for g, v in tpr.items()}
    out.update(di=di, abs_one_minus_di=abs(1.0 - di), delta_eop=eop, fairness_score=fairness_score(di, eop))
    return out


def detection_fairness(
    pairs: Sequence[Pair],
    num_groups: int,
    iou_threshold: float = 0.5,
    score_threshold: float = 0.25,
) -> dict[str, float]:
    """Flat dict: tpr/<g> for present groups, di and abs_one_minus_di (on TPR), delta_eop, fairness_score."""
    tp, fn = group_counts(pairs, num_groups, iou_threshold, score_threshold)
    rates = group_tpr(tp, fn)
    tpr = {g: float(r) for g, r in enumerate(rates.tolist()) if not math.isnan(r)}
    arr = np.array(list(tpr.values()))
    return _summary(tpr, arr, arr)


def _binary(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values.detach().cpu() if isinstance(values, Tensor) else values).reshape(-1)
    if arr.size and not np.isin(arr, (0, 1)).all():
        raise ValueError(f"{name} must be binary (0/1), got values {np.unique(arr)[:10].tolist()}")
    return arr.astype(np.int64)


def _classification_inputs(y_true: Any, y_pred: Any, sensitive: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    yt, yp = _binary("y_true", y_true), _binary("y_pred", y_pred)
    s = np.asarray(sensitive.detach().cpu() if isinstance(sensitive, Tensor) else sensitive).reshape(-1)
    if not np.issubdtype(s.dtype, np.integer):
        raise ValueError(f"sensitive must hold integer group ids (-1 = unknown), got dtype {s.dtype}")
    if not yt.size == yp.size == s.size:
        raise ValueError(f"y_true, y_pred, sensitive lengths differ: {yt.size}, {yp.size}, {s.size}")
    if yt.size == 0:
        raise ValueError("y_true is empty")
    if (s < -1).any():
        raise ValueError(f"sensitive must be >= -1, got min {s.min()}")
    return yt, yp, s


def group_positive_rates(y_true: Any, y_pred: Any, sensitive: Any) -> dict[str, dict[int, float]]:
    """Per known group: selection rate P(yhat=1|s), TPR P(yhat=1|y=1,s), FPR P(yhat=1|y=0,s); NaN if undefined."""
    yt, yp, s = _classification_inputs(y_true, y_pred, sensitive)
    out: dict[str, dict[int, float]] = {"selection_rate": {}, "tpr": {}, "fpr": {}}
    for g in np.unique(s[s >= 0]).tolist():
        in_g = s == g
        pos, neg = in_g & (yt == 1), in_g & (yt == 0)
        out["selection_rate"][g] = float(yp[in_g].mean())
        out["tpr"][g] = float(yp[pos].mean()) if pos.any() else math.nan
        out["fpr"][g] = float(yp[neg].mean()) if neg.any() else math.nan
    return out


def classification_fairness(y_true: Any, y_pred: Any, sensitive: Any) -> dict[str, float]:
    """Flat dict: accuracy, selection_rate|tpr|fpr/<g>, di (on selection rate), abs_one_minus_di,
    delta_eop (on TPR), eo_gap, fairness_score. Accuracy covers all samples; group metrics skip s = -1."""
    yt, yp, _ = _classification_inputs(y_true, y_pred, sensitive)
    rates = group_positive_rates(y_true, y_pred, sensitive)
    if not rates["selection_rate"]:
        raise ValueError("sensitive has no known group (all -1)")
    tpr = rates["tpr"]
    out = _summary(tpr, np.array(list(rates["selection_rate"].values())), np.array(list(tpr.values())))
    out["accuracy"] = float((yt == yp).mean())
    out["eo_gap"] = eo_gap(np.array(list(tpr.values())))
    for key in ("selection_rate", "fpr"):
        out.update({f"{key}/{g}": v for g, v in rates[key].items()})
    return out
