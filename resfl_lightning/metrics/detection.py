"""COCO mAP (docs/method.md §6) through torchmetrics' MeanAveragePrecision with the faster_coco_eval backend."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor
from torchmetrics.detection import MeanAveragePrecision

__all__ = ["detection_map", "to_torchmetrics"]


def to_torchmetrics(
    preds: Sequence[Mapping[str, Tensor]], gts: Sequence[Mapping[str, Tensor]]
) -> tuple[list[dict[str, Tensor]], list[dict[str, Tensor]]]:
    """Our per-image pred/gt dicts -> torchmetrics' (preds, target) lists: xyxy float32 boxes, int64 labels."""
    if len(preds) != len(gts):
        raise ValueError(f"preds has {len(preds)} images but gts has {len(gts)}")
    tm_preds, tm_target = [], []
    for idx, (pred, gt) in enumerate(zip(preds, gts, strict=True)):
        for key in ("boxes", "scores", "labels"):
            if key not in pred:
                raise KeyError(f"image {idx}: prediction dict lacks key '{key}' (has {sorted(pred)})")
        for key in ("boxes", "labels"):
            if key not in gt:
                raise KeyError(f"image {idx}: ground-truth dict lacks key '{key}' (has {sorted(gt)})")
        tm_preds.append(
            {
                "boxes": pred["boxes"].detach().float().cpu().reshape(-1, 4),
                "scores": pred["scores"].detach().float().cpu().reshape(-1),
                "labels": pred["labels"].detach().long().cpu().reshape(-1),
            }
        )
        tm_target.append(
            {
                "boxes": gt["boxes"].detach().float().cpu().reshape(-1, 4),
                "labels": gt["labels"].detach().long().cpu().reshape(-1),
            }
        )
    return tm_preds, tm_target


def detection_map(
    preds: Sequence[Mapping[str, Tensor]], gts: Sequence[Mapping[str, Tensor]], class_metrics: bool = False
) -> dict[str, float]:
    """map (IoU 0.50:0.95), map_50, map_75 and, with class_metrics, map/<class>; -1 where there is no ground truth."""
    tm_preds, tm_target = to_torchmetrics(preds, gts)
    # sync_on_compute=False: each rank scores its own clients; torchmetrics would otherwise all_gather across ranks.
    metric = MeanAveragePrecision(
        iou_type="bbox", box_format="xyxy", backend="faster_coco_eval", class_metrics=class_metrics,
        sync_on_compute=False,
    )
    metric.update(tm_preds, tm_target)
    res = metric.compute()
    out = {key: float(res[key]) for key in ("map", "map_50", "map_75")}
    if class_metrics:
        classes = res["classes"].reshape(-1).tolist()
        per_class = res["map_per_class"].reshape(-1).tolist()
        out.update({f"map/{int(c)}": float(v) for c, v in zip(classes, per_class, strict=True)})
    return out
