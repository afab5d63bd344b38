"""Sensitive-attribute adversary behind a GRL, its loss, and ROI pooling of neck features into per-person vectors."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import roi_align

from resfl_lightning.losses.grl import GradientReversal
from resfl_lightning.losses.roi_mean import ROI_IMPLS, roi_box_mean


class Adversary(nn.Module):
    """A(h; phi): GRL -> `depth` x [Linear(., hidden) -> ReLU -> Dropout] -> Linear(., num_groups) group logits.

    depth = 1 is the paper's two-layer MLP; depth = 0 is a linear probe (docs/method.md §1)."""

    def __init__(
        self, in_dim: int, num_groups: int, hidden: int = 128, dropout: float = 0.1, grl_scale: float = 1.0,
        depth: int = 1,
    ) -> None:
        super().__init__()
        if in_dim < 1 or num_groups < 2 or hidden < 1 or depth < 0:
            raise ValueError(f"Adversary needs in_dim >= 1, num_groups >= 2, hidden >= 1, depth >= 0; got {in_dim}, "
                             f"{num_groups}, {hidden}, {depth}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"Adversary dropout must be in [0, 1), got {dropout}")
        self.in_dim = in_dim
        self.num_groups = num_groups
        self.depth = depth
        self.grl = GradientReversal(grl_scale)
        layers: list[nn.Module] = []
        width = in_dim
        for _ in range(depth):  # built in this order so depth = 1 draws the same initial weights as before
            layers += [nn.Linear(width, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout)]
            width = hidden
        self.mlp = nn.Sequential(*layers, nn.Linear(width, num_groups))

    @property
    def grl_scale(self) -> float:
        return self.grl.scale

    @grl_scale.setter
    def grl_scale(self, value: float) -> None:
        self.grl.scale = value

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if h.dim() != 2 or h.shape[1] != self.in_dim:
            raise ValueError(f"Adversary expects features of shape (M, {self.in_dim}), got {tuple(h.shape)}")
        return self.mlp(self.grl(h))


def adversarial_loss(adversary: Adversary, features: torch.Tensor, groups: torch.Tensor,
                     check: bool = True) -> torch.Tensor:
    """Mean cross-entropy of the adversary over samples with a known group (>= 0); graph-connected 0 when none.

    `check=False` skips the range check of the group labels (a host read): for callers that have checked them on the
    device already (the training step, FederatedClient.adversary_loss)."""
    groups = groups.reshape(-1).long()
    if features.shape[0] != groups.shape[0]:
        raise ValueError(f"adversarial_loss: {features.shape[0]} feature rows but {groups.shape[0]} group labels")
    if check and groups.numel() and int(groups.max()) >= adversary.num_groups:
        raise ValueError(
            f"adversarial_loss: group index {int(groups.max())} out of range for {adversary.num_groups} groups"
        )
    known = groups >= 0
    logits = adversary(features[known])
    if logits.shape[0] == 0:
        # Keeps the step's graph uniform (DDP / Fabric expect every parameter to receive a gradient).
        return logits.sum() * 0.0
    return F.cross_entropy(logits, groups[known])


def roi_pool_features(
    feature_maps: Sequence[torch.Tensor],
    strides: Sequence[int],
    boxes_xyxy_pixels: torch.Tensor,
    batch_idx: torch.Tensor,
    output_size: int = 7,
    check_batch_idx: bool = True,
    sampling_ratio: int = -1,
    impl: str = "roi_align",
) -> torch.Tensor:
    """ROIAlign each box at every level (scale 1/stride, aligned), global-average-pool, concat levels: (M, sum C_l).

    The mean over output_size^2 bins of s x s samples each is the mean over (output_size s)^2 evenly spaced samples
    of the box, so (output_size, s) = (1, 7k) equals (7, k); the default (7, -1: s = ceil(box side / 7) per box) is
    the paper-faithful pooling, and (1, small s) a cheaper, coarser box mean (algorithm.adversary_roi_*).

    `impl`: "roi_align" (torchvision's, then the mean) or "separable" (losses/roi_mean.py: the same value as weight
    vectors and matrix products, without roi_align's per-sample scatter in the backward; other float rounding).

    `check_batch_idx=False` skips the range check of batch_idx (a host read per call) where the caller built it
    (detection_collate numbers each batch's images 0..B-1)."""
    if len(feature_maps) == 0 or len(feature_maps) != len(strides):
        raise ValueError(f"roi_pool_features: {len(feature_maps)} feature maps but {len(strides)} strides")
    if boxes_xyxy_pixels.dim() != 2 or boxes_xyxy_pixels.shape[1] != 4:
        raise ValueError(f"roi_pool_features: boxes must be (M, 4) xyxy, got {tuple(boxes_xyxy_pixels.shape)}")
    batch_idx = batch_idx.reshape(-1)
    if batch_idx.shape[0] != boxes_xyxy_pixels.shape[0]:
        raise ValueError(
            f"roi_pool_features: {boxes_xyxy_pixels.shape[0]} boxes but {batch_idx.shape[0]} batch indices"
        )
    batch_size = feature_maps[0].shape[0]
    if check_batch_idx and batch_idx.numel() and (int(batch_idx.min()) < 0 or int(batch_idx.max()) >= batch_size):
        raise ValueError(f"roi_pool_features: batch_idx outside [0, {batch_size})")
    if impl not in ROI_IMPLS:
        raise ValueError(f"roi_pool_features: impl must be one of {ROI_IMPLS}, got {impl!r}")
    pooled = []
    for level, (fmap, stride) in enumerate(zip(feature_maps, strides, strict=True)):
        if fmap.dim() != 4 or fmap.shape[0] != batch_size:
            raise ValueError(f"roi_pool_features: level {level} map has shape {tuple(fmap.shape)}, batch {batch_size}")
        if stride <= 0:
            raise ValueError(f"roi_pool_features: level {level} stride must be > 0, got {stride}")
        rois = torch.cat([batch_idx.to(fmap.dtype)[:, None], boxes_xyxy_pixels.to(fmap.dtype)], dim=1).to(fmap.device)
        if impl == "separable":
            pooled.append(roi_box_mean(fmap, rois, 1.0 / stride, output_size, sampling_ratio))
            continue
        crops = roi_align(
            fmap, rois, output_size=output_size, spatial_scale=1.0 / stride, sampling_ratio=sampling_ratio,
            aligned=True
        )
        pooled.append(crops.mean(dim=(2, 3)))
    return torch.cat(pooled, dim=1)
