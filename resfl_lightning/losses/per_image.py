"""The detection loss as a mean of independent per-image losses, for per-example DP-SGD.

ultralytics normalises the batch loss by the batch's target-score sum, so one image's gradient depends on every other
image's targets and the per-example sensitivity bound of DP-SGD does not hold. Here each image's loss is normalised
by that image's own target-score sum and the batch loss is their mean, so opacus' per-sample gradients
(loss_reduction="mean") are exactly each image's own gradient.
"""

from __future__ import annotations

import torch

from resfl_lightning.losses.detection import DetectionLossOutput, EvidentialDetectionLoss


def image_slice(out: dict, i: int) -> dict:
    """Image i's raw outputs (tensors and lists of tensors with the batch first), graph kept."""
    return {k: [t[i: i + 1] for t in v] if isinstance(v, (list, tuple)) else v[i: i + 1] for k, v in out.items()}


def image_targets(batch: dict, i: int) -> dict:
    """Image i's annotations as a one-image batch (batch_idx 0)."""
    keep = batch["batch_idx"].long() == i
    sub = {k: batch[k][keep] for k in ("cls", "bboxes", "groups")}
    sub["batch_idx"] = torch.zeros_like(batch["batch_idx"][keep])
    sub["img"] = batch["img"][i: i + 1]
    return sub


def per_image_detection_loss(criterion: EvidentialDetectionLoss, out: dict, batch: dict) -> DetectionLossOutput:
    """task = mean_i task_i with task_i the criterion on image i alone (one batched pass: the assignment is per image
    already, and each image's terms are normalised by its own target-score sum); `per_image_loss_loop` is the
    image-by-image definition it equals."""
    if out["scores"].shape[0] == 0:
        raise ValueError("per_image_detection_loss: empty batch (an empty Poisson draw takes a noise-only step)")
    return criterion.compute(out, batch, per_image=True)


def per_image_loss_loop(criterion: EvidentialDetectionLoss, out: dict, batch: dict) -> DetectionLossOutput:
    """The definition, one criterion call per image (the reference `per_image_detection_loss` is tested against)."""
    bsz = out["scores"].shape[0]
    if bsz == 0:
        raise ValueError("per_image_loss_loop: empty batch")
    results = [criterion.compute(image_slice(out, i), image_targets(batch, i)) for i in range(bsz)]
    task = torch.stack([r.task for r in results]).mean()
    parts = {k: torch.stack([r.parts[k] for r in results]).mean() for k in results[0].parts}
    return DetectionLossOutput(
        task=task, parts=parts, per_image_cls=torch.cat([r.per_image_cls for r in results]),
        fg_unc=torch.cat([r.fg_unc for r in results]), fg_nig_reg=torch.cat([r.fg_nig_reg for r in results]),
        fg_groups=torch.cat([r.fg_groups for r in results]))
