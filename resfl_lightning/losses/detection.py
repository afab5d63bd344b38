"""Evidential YOLOv8 detection loss: ultralytics' task-aligned assignment, CIoU + DFL, Dirichlet NLL, NIG NLL."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from ultralytics.utils.loss import v8DetectionLoss
from ultralytics.utils.ops import xyxy2xywh
from ultralytics.utils.tal import TaskAlignedAssigner

from resfl_lightning.losses.evidential import (
    dirichlet_kl_uniform,
    dirichlet_nll,
    nig_nll,
    nig_params,
    nig_regulariser,
)


@dataclass
class DetectionLossOutput:
    """Task loss and the per-anchor pieces the regularisers and the Fisher term need."""

    task: torch.Tensor  # box + cls + dfl + nig, a scalar
    parts: dict[str, torch.Tensor]  # detached components for logging
    per_image_cls: torch.Tensor  # (B,) per-image Dirichlet NLL, differentiable (Fisher samples)
    fg_unc: torch.Tensor  # (F,) per-foreground-anchor KL(Dir(alpha~)||Dir(1)) with hard targets, not yet annealed
    fg_nig_reg: torch.Tensor  # (F,) per-foreground-anchor NIG regulariser
    fg_groups: torch.Tensor  # (F,) sensitive group of the person each foreground anchor is assigned to


class EvidentialDetectionLoss(v8DetectionLoss):
    """Reuses ultralytics' assigner, box decoding and CIoU/DFL loss; swaps BCE for the Dirichlet NLL. `model` is
    models/yolo.py's EvidentialYOLO (its `detector` and `num_classes`; not imported: models/ stands above losses/)."""

    def __init__(self, model: torch.nn.Module, box: float = 7.5, cls: float = 0.5, dfl: float = 1.5,
                 nig: float = 1.0, nig_detach_mean: bool = True, tal_topk: int = 10):
        model.detector.args = SimpleNamespace(box=box, cls=cls, dfl=dfl)
        super().__init__(model.detector, tal_topk=tal_topk)
        self.num_classes = model.num_classes
        self.nc = model.num_classes  # the assigner works on object classes; background is implicit
        self.assigner = TaskAlignedAssigner(topk=tal_topk, num_classes=self.nc, alpha=0.5, beta=6.0,
                                            stride=self.stride.tolist())
        self.nig_gain = nig
        self.nig_detach_mean = nig_detach_mean

    def follow(self, device: torch.device) -> None:
        """Keep the criterion's constant tensors on the predictions' device: ultralytics fixes them at construction
        (the model's device then), and Fabric later moves the client module, which this plain object is not part of."""
        if self.proj.device == device:
            return
        self.device = device
        self.proj = self.proj.to(device)
        self.bbox_loss = self.bbox_loss.to(device)
        if self.class_weights is not None:
            self.class_weights = self.class_weights.to(device)

    def _padded_groups(self, batch: dict, batch_size: int, n_max: int) -> torch.Tensor:
        """Groups laid out like ultralytics' padded targets (B, n_max), -1 for padding/unknown."""
        out = torch.full((batch_size, n_max), -1, dtype=torch.long, device=self.device)
        if n_max == 0:
            return out
        bi = batch["batch_idx"].long().to(self.device)
        offsets = torch.zeros(batch_size + 1, dtype=torch.long, device=self.device)
        offsets.scatter_add_(0, bi + 1, torch.ones_like(bi))
        within = torch.arange(bi.numel(), device=self.device) - offsets.cumsum(0)[bi]
        out[bi, within] = batch["groups"].long().to(self.device)
        return out

    def compute(self, out: dict, batch: dict, per_image: bool = False) -> DetectionLossOutput:
        """The batch loss, normalised by the batch's target-score sum (ultralytics); with `per_image`, the mean over
        images of each image's loss normalised by its own target-score sum (per-example DP-SGD, losses/per_image.py)."""
        feats = out["feats"]
        self.follow(out["boxes"].device)
        pred_distri = out["boxes"].permute(0, 2, 1).contiguous()
        logits = out["scores"].permute(0, 2, 1).contiguous().float()
        nig_raw = out["nig"].permute(0, 2, 1).reshape(logits.shape[0], logits.shape[1], 4, 3)
        anchor_points, stride_tensor = make_anchors_cached(feats, self.stride)
        bsz = logits.shape[0]
        imgsz = torch.tensor(feats[0].shape[2:], device=self.device, dtype=logits.dtype) * self.stride[0]

        targets = torch.cat((batch["batch_idx"].view(-1, 1), batch["cls"].view(-1, 1), batch["bboxes"]), 1)
        targets = self.preprocess(targets.to(self.device), bsz, scale_tensor=imgsz[[1, 0, 1, 0]])
        gt_labels, gt_bboxes = targets.split((1, 4), 2)
        mask_gt = gt_bboxes.sum(2, keepdim=True).gt_(0.0)
        pred_bboxes = self.bbox_decode(anchor_points, pred_distri)

        alpha = 1.0 + torch.nn.functional.softplus(logits)  # (B, A, C+1)
        alpha0 = alpha.sum(-1, keepdim=True)
        obj_prob = (alpha[..., : self.nc] / alpha0).detach()
        target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx = self.assigner(
            obj_prob, (pred_bboxes.detach() * stride_tensor).type(gt_bboxes.dtype), anchor_points * stride_tensor,
            gt_labels, gt_bboxes, mask_gt,
        )
        target_scores = target_scores.to(logits.dtype)
        target_scores_sum = target_scores.sum().clamp(min=1)
        y = torch.cat([target_scores, (1.0 - target_scores.sum(-1, keepdim=True)).clamp(min=0)], dim=-1)

        nll = dirichlet_nll(alpha, y)  # (B, A)
        image_sums = target_scores.sum((1, 2), keepdim=True).clamp(min=1)  # (B, 1, 1)
        per_image_cls = nll.sum(1) / image_sums.view(-1)
        if per_image:
            # Each anchor's weight divided by its own image's score sum and the sums by B: the box, DFL and NIG terms
            # (weighted sums over anchors) become means over images of per-image losses.
            loss_cls = per_image_cls.mean()
            weights = target_scores / image_sums
            target_scores_sum = target_scores.new_tensor(float(bsz))
        else:
            loss_cls = nll.sum() / target_scores_sum
            weights = target_scores
        loss_box, loss_dfl = self.bbox_loss(pred_distri, pred_bboxes, anchor_points, target_bboxes / stride_tensor,
                                            weights, target_scores_sum, fg_mask, imgsz, stride_tensor)

        # NIG on assigned boxes, coordinates normalised by the image size (so Var/s^2 needs no rescale).
        scale = imgsz[[1, 0, 1, 0]]
        nu, a_nig, beta = nig_params(nig_raw[fg_mask])
        y_box = xyxy2xywh(target_bboxes[fg_mask]) / scale
        gamma = xyxy2xywh((pred_bboxes * stride_tensor)[fg_mask]) / scale
        gamma_nll = gamma.detach() if self.nig_detach_mean else gamma
        weight = weights[fg_mask].sum(-1)
        if fg_mask.any():
            loss_nig = (nig_nll(y_box, gamma_nll, nu, a_nig, beta).mean(-1) * weight).sum() / target_scores_sum
        else:
            loss_nig = nig_raw.sum() * 0.0
        fg_nig_reg = nig_regulariser(y_box, gamma, nu, a_nig).mean(-1)

        groups = self._padded_groups(batch, bsz, gt_bboxes.shape[1])
        fg_groups = groups.gather(1, target_gt_idx.clamp(min=0))[fg_mask] if groups.shape[1] else \
            torch.empty(0, dtype=torch.long, device=self.device)
        # KL target: the anchor's HARD outcome (its assigned class), never the soft task-aligned score, which would
        # penalise evidence for the correct class (docs/method.md §2, L_unc).
        y_hard = torch.nn.functional.one_hot(target_labels[fg_mask].long(), self.nc + 1).to(alpha.dtype)
        fg_unc = dirichlet_kl_uniform(alpha[fg_mask], y_hard)

        hyp = self.hyp
        task = hyp.box * loss_box + hyp.cls * loss_cls + hyp.dfl * loss_dfl + self.nig_gain * loss_nig
        parts = {"box": loss_box.detach(), "cls": loss_cls.detach(), "dfl": loss_dfl.detach(),
                 "nig": loss_nig.detach()}
        return DetectionLossOutput(task=task, parts=parts, per_image_cls=per_image_cls, fg_unc=fg_unc,
                                   fg_nig_reg=fg_nig_reg, fg_groups=fg_groups)


_ANCHOR_CACHE: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def make_anchors_cached(feats: list[torch.Tensor], strides: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor grid depends only on the feature shapes; rebuild it once per input size."""
    from ultralytics.utils.tal import make_anchors

    key = (tuple(tuple(f.shape[2:]) for f in feats), feats[0].device, feats[0].dtype)
    if key not in _ANCHOR_CACHE:
        _ANCHOR_CACHE[key] = make_anchors(feats, strides, 0.5)
    return _ANCHOR_CACHE[key]
