"""The box mean of an aligned roi_align, as two weight vectors per box and two batched matrix products.

`torchvision.ops.roi_align(..., aligned=True).mean((2, 3))` averages bilinear samples on a grid that is the product of
a row of y positions and a row of x positions, and a sample's bilinear weight is a y factor times an x factor (also
its out-of-map test: y outside [-1, H] or x outside [-1, W]). So the box mean is a_yᵀ F a_x / n, with a_y (a_x) the
summed y (x) weights of the box's samples over the map's rows (columns) and n the sample count. Forward and backward
are then matrix products, where roi_align's backward scatters every sample into the map one by one (most of RESFL's
step overhead on the detector, docs/performance.md). The same value up to float rounding (the sums run in another
order): tests/unit/losses/test_roi_mean.py compares values and gradients with roi_align's."""

from __future__ import annotations

import torch

ROI_IMPLS = ("roi_align", "separable")  # algorithm.adversary_roi_impl: torchvision's roi_align, or roi_box_mean here


def axis_weights(start: torch.Tensor, length: torch.Tensor, bins: int, grid: torch.Tensor, extent: int) -> torch.Tensor:
    """(M, extent): for each box, the summed bilinear weights of its bins x grid sample positions along one axis
    (positions start + p * length/bins + (i + 0.5) * (length/bins) / grid), with roi_align's rules: a position
    outside [-1, extent] adds nothing, one below 0 reads at 0, one at or past extent - 1 reads the last cell."""
    m = start.shape[0]
    top = int(grid.max()) if m else 0  # the largest per-box sample count: one host read per call
    out = start.new_zeros(m, extent)
    if top <= 0:
        return out
    bin_size = length / bins
    steps = torch.arange(top, device=start.device, dtype=start.dtype)
    offsets = torch.arange(bins, device=start.device, dtype=start.dtype)
    g = grid.to(start.dtype).clamp(min=1)[:, None, None]
    pos = (start[:, None, None] + offsets[None, :, None] * bin_size[:, None, None]
           + (steps[None, None, :] + 0.5) * bin_size[:, None, None] / g)
    used = (steps[None, None, :] < grid[:, None, None]) & (pos >= -1.0) & (pos <= extent)
    pos = pos.clamp(min=0)
    low = pos.floor().long()
    last = low >= extent - 1
    low = torch.where(last, torch.full_like(low, extent - 1), low)
    high = torch.where(last, low, low + 1)
    frac = torch.where(last, torch.zeros_like(pos), pos - low.to(pos.dtype))
    keep = used.to(pos.dtype)
    out.scatter_add_(1, low.reshape(m, -1), ((1 - frac) * keep).reshape(m, -1))
    out.scatter_add_(1, high.reshape(m, -1), (frac * keep).reshape(m, -1))
    return out


def roi_box_mean(fmap: torch.Tensor, rois: torch.Tensor, spatial_scale: float, output_size: int = 7,
                 sampling_ratio: int = -1) -> torch.Tensor:
    """(M, C): `roi_align(fmap, rois, output_size, spatial_scale, sampling_ratio, aligned=True).mean((2, 3))`,
    rois (M, 5) = (batch index, x1, y1, x2, y2) in input pixels; sampling_ratio -1: ceil(box side / output_size)
    samples per bin side, per box (roi_align's adaptive rule). Computed in float32 at least, as roi_align runs under
    autocast: box corners in bfloat16 would be off by pixels."""
    work = torch.promote_types(fmap.dtype, torch.float32)
    fmap, rois = fmap.to(work), rois.to(work)
    b, c, h, w = fmap.shape
    m = rois.shape[0]
    x1, y1, x2, y2 = (rois[:, i] * spatial_scale - 0.5 for i in range(1, 5))  # aligned: half a cell back
    width, height = x2 - x1, y2 - y1
    if sampling_ratio > 0:
        grid_y = grid_x = torch.full((m,), sampling_ratio, dtype=torch.long, device=fmap.device)
    else:
        grid_y = torch.ceil(height / output_size).long().clamp(min=0)
        grid_x = torch.ceil(width / output_size).long().clamp(min=0)
    ay = axis_weights(y1, height, output_size, grid_y, h)
    ax = axis_weights(x1, width, output_size, grid_x, w)
    count = (output_size * output_size) * (grid_y * grid_x).clamp(min=1).to(fmap.dtype)
    # per image, its boxes side by side (padded to the most boxes an image has): x contracted by one batched product
    # with the image's map, then y; a box meets only its own image's map
    image = rois[:, 0].long()
    slot = slot_in_image(image, b)
    most = int(slot.max()) + 1 if m else 0  # one host read per call
    ax_pad = ax.new_zeros(b, most, w).index_put((image, slot), ax)
    ay_pad = ay.new_zeros(b, most, h).index_put((image, slot), ay)
    along_x = torch.bmm(fmap.reshape(b, c * h, w), ax_pad.transpose(1, 2))  # (B, C*H, most)
    along_x = along_x.reshape(b, c, h, most).permute(0, 3, 1, 2).reshape(b * most, c, h)
    pooled = torch.bmm(along_x, ay_pad.reshape(b * most, h, 1)).reshape(b, most, c)
    return pooled[image, slot] / count[:, None]


def slot_in_image(image: torch.Tensor, images: int) -> torch.Tensor:
    """(M,): each box's position among the boxes of its own image (0, 1, ... in the order given)."""
    order = torch.argsort(image, stable=True)
    counts = torch.bincount(image, minlength=images)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.empty_like(image)
    slot[order] = torch.arange(image.numel(), device=image.device) - starts[image[order]]
    return slot
