"""Fairness matching protocol (docs/method.md §6): per-image greedy one-to-one matching of predictions to ground truth.

IoU is only ever computed between boxes of the same image; pooling boxes across images is a known trap
(docs/method.md §9).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import box_iou

__all__ = ["match_image", "match_pred_gt"]


def _check_boxes(name: str, boxes: Tensor) -> None:
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"{name} must have shape (n, 4) in xyxy pixels, got {tuple(boxes.shape)}")


def _check_vector(name: str, values: Tensor, n: int, ref: str) -> None:
    if values.ndim != 1 or values.shape[0] != n:
        raise ValueError(f"{name} must have shape ({n},) to match {ref}, got {tuple(values.shape)}")


def match_image(
    pred_boxes: Tensor,
    pred_scores: Tensor,
    pred_labels: Tensor,
    gt_boxes: Tensor,
    gt_labels: Tensor,
    iou_threshold: float = 0.5,
) -> tuple[Tensor, Tensor]:
    """Greedy one-to-one matching of one image's predictions to its ground truth.

    Predictions are visited by descending score; each takes the unmatched same-class GT of highest IoU, provided
    IoU >= iou_threshold. Predictions with equal scores are resolved by higher IoU: within a tie, the remaining
    (prediction, GT) pair of highest IoU is matched first. Remaining ties fall back to the lower index.
    Returns (pred_to_gt: int64 (n,), -1 when unmatched; gt_matched: bool (m,)).
    """
    _check_boxes("pred_boxes", pred_boxes)
    _check_boxes("gt_boxes", gt_boxes)
    n, m = pred_boxes.shape[0], gt_boxes.shape[0]
    _check_vector("pred_scores", pred_scores, n, "pred_boxes")
    _check_vector("pred_labels", pred_labels, n, "pred_boxes")
    _check_vector("gt_labels", gt_labels, m, "gt_boxes")
    if not 0.0 < iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must lie in (0, 1], got {iou_threshold}")
    pred_to_gt = np.full(n, -1, dtype=np.int64)
    gt_matched = np.zeros(m, dtype=bool)
    if n == 0 or m == 0:
        return torch.from_numpy(pred_to_gt), torch.from_numpy(gt_matched)

    iou = box_iou(pred_boxes.detach().double().cpu(), gt_boxes.detach().double().cpu()).numpy()
    same_class = pred_labels.detach().cpu().numpy()[:, None] == gt_labels.detach().cpu().numpy()[None, :]
    # -1 marks pairs that can never match, so "best candidate" is simply the column argmax.
    cand = np.where(same_class & (iou >= iou_threshold), iou, -1.0)

    scores = pred_scores.detach().double().cpu().numpy()
    order = np.argsort(-scores, kind="stable")
    start = 0
    while start < n:
        stop = start + 1
        while stop < n and scores[order[stop]] == scores[order[start]]:
            stop += 1
        tied = order[start:stop]
        # Greedy by IoU inside a score tie; for a single prediction this is "pick the highest-IoU free GT".
        while True:
            sub = cand[np.ix_(tied, np.arange(m))].copy()
            sub[pred_to_gt[tied] >= 0, :] = -1.0
            sub[:, gt_matched] = -1.0
            flat = int(np.argmax(sub))
            i, j = divmod(flat, m)
            if sub[i, j] < 0:
                break
            pred_to_gt[tied[i]] = j
            gt_matched[j] = True
        start = stop
    return torch.from_numpy(pred_to_gt), torch.from_numpy(gt_matched)


def match_pred_gt(
    pred: Mapping[str, Tensor],
    gt: Mapping[str, Tensor],
    iou_threshold: float = 0.5,
    score_threshold: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """match_image on the project's pred/gt dicts; predictions scoring below score_threshold are ignored (-1)."""
    for key in ("boxes", "scores", "labels"):
        if key not in pred:
            raise KeyError(f"prediction dict lacks key '{key}' (has {sorted(pred)})")
    for key in ("boxes", "labels"):
        if key not in gt:
            raise KeyError(f"ground-truth dict lacks key '{key}' (has {sorted(gt)})")
    _check_boxes("pred['boxes']", pred["boxes"])
    n = pred["boxes"].shape[0]
    _check_vector("pred['scores']", pred["scores"], n, "pred['boxes']")
    _check_vector("pred['labels']", pred["labels"], n, "pred['boxes']")
    scores = pred["scores"]
    keep = torch.nonzero(scores >= score_threshold).flatten()
    sub_to_gt, gt_matched = match_image(
        pred["boxes"][keep], scores[keep], pred["labels"][keep], gt["boxes"], gt["labels"], iou_threshold
    )
    pred_to_gt = torch.full((scores.shape[0],), -1, dtype=torch.long)
    pred_to_gt[keep] = sub_to_gt
    return pred_to_gt, gt_matched
