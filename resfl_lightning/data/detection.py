"""Generic annotated-image containers, the detection Dataset and the batch collate (format: docs/CONVENTIONS.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import cv2
import numpy as np
import torch
from torch.utils.data import Dataset

# (image uint8 HxWx3, boxes float32 (m,4) xywhn, rng) -> (image, boxes); must keep the number and order of boxes.
Augmentation = Callable[[np.ndarray, np.ndarray, np.random.Generator], tuple[np.ndarray, np.ndarray]]

_BOX_TOL = 1e-4  # slack for float round-off when checking normalised boxes


@dataclass
class Annotations:
    """Per-object annotation arrays (one row per object), sorted by image index.

    boxes are normalised xywh (centre x, centre y, w, h in [0, 1]); groups are 0-based sensitive groups or -1
    (unknown); proxy is a non-sensitive cohort label (e.g. 0 = well lit, 1 = dim) or -1; extra holds further
    per-object columns (e.g. "mst").
    """

    image_index: np.ndarray
    cls: np.ndarray
    boxes: np.ndarray
    groups: np.ndarray
    proxy: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.image_index = np.asarray(self.image_index, dtype=np.int64).reshape(-1)
        m = len(self.image_index)
        self.cls = np.asarray(self.cls, dtype=np.int64).reshape(-1)
        self.boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        self.groups = np.asarray(self.groups, dtype=np.int64).reshape(-1)
        self.proxy = np.asarray(self.proxy, dtype=np.int64).reshape(-1)
        self.extra = {k: np.asarray(v) for k, v in self.extra.items()}
        columns = {"cls": self.cls, "boxes": self.boxes, "groups": self.groups, "proxy": self.proxy, **self.extra}
        for name, col in columns.items():
            if len(col) != m:
                raise ValueError(f"annotation column {name!r} has {len(col)} rows, image_index has {m}")
        if m and self.image_index.min() < 0:
            raise ValueError(f"annotation row {int(np.argmin(self.image_index))}: negative image index")
        if m and self.groups.min() < -1:
            raise ValueError(f"annotation row {int(np.argmin(self.groups))}: group must be >= -1")
        if m and self.cls.min() < 0:
            raise ValueError(f"annotation row {int(np.argmin(self.cls))}: class must be >= 0")
        bad = ~np.isfinite(self.boxes).all(1)
        bad |= (self.boxes[:, 2] <= 0) | (self.boxes[:, 3] <= 0)
        lo = self.boxes[:, :2] - self.boxes[:, 2:] / 2
        hi = self.boxes[:, :2] + self.boxes[:, 2:] / 2
        bad |= (lo < -_BOX_TOL).any(1) | (hi > 1 + _BOX_TOL).any(1)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"annotation row {row}: box {self.boxes[row].tolist()} is not a valid normalised xywh box")
        if m and np.any(np.diff(self.image_index) < 0):  # keep rows grouped by image for O(log M) lookup
            order = np.argsort(self.image_index, kind="stable")
            self.image_index, self.cls, self.boxes = self.image_index[order], self.cls[order], self.boxes[order]
            self.groups, self.proxy = self.groups[order], self.proxy[order]
            self.extra = {k: v[order] for k, v in self.extra.items()}

    def __len__(self) -> int:
        return len(self.image_index)

    def rows_of(self, image: int) -> slice:
        """Rows belonging to one image (a slice, since rows are sorted by image index)."""
        lo, hi = np.searchsorted(self.image_index, [image, image + 1])
        return slice(int(lo), int(hi))

    def select(self, rows: np.ndarray | slice) -> Annotations:
        """A new Annotations with only the given rows (mask, index array or slice)."""
        return Annotations(
            self.image_index[rows], self.cls[rows], self.boxes[rows], self.groups[rows], self.proxy[rows],
            {k: v[rows] for k, v in self.extra.items()},
        )


@runtime_checkable
class AnnotatedImages(Protocol):
    """What every detection source (synthetic, FACET, CARLA) provides: images by index plus annotation arrays."""

    annotations: Annotations

    def __len__(self) -> int: ...

    def load_image(self, i: int) -> np.ndarray: ...


def _check_image(image: np.ndarray, i: int) -> np.ndarray:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        shape = getattr(image, "shape", None)
        dtype = getattr(image, "dtype", type(image))
        raise ValueError(f"image {i}: expected uint8 HxWx3 RGB array, got {dtype} {shape}")
    return image


@dataclass
class ArrayImages:
    """In-memory images (N, H, W, 3) uint8 RGB with their annotations."""

    images: np.ndarray
    annotations: Annotations

    def __post_init__(self) -> None:
        if self.images.dtype != np.uint8 or self.images.ndim != 4 or self.images.shape[3] != 3:
            raise ValueError(f"images must be uint8 (N, H, W, 3), got {self.images.dtype} {self.images.shape}")
        if len(self.annotations) and self.annotations.image_index.max() >= len(self.images):
            raise ValueError(
                f"annotation image index {int(self.annotations.image_index.max())} >= number of images "
                f"{len(self.images)}"
            )

    def __len__(self) -> int:
        return len(self.images)

    def load_image(self, i: int) -> np.ndarray:
        return self.images[i]


@dataclass
class LoaderImages:
    """Images produced on demand by loader(i) -> uint8 HxWx3 RGB (file-based datasets)."""

    num_images: int
    loader: Callable[[int], np.ndarray]
    annotations: Annotations

    def __post_init__(self) -> None:
        if len(self.annotations) and self.annotations.image_index.max() >= self.num_images:
            raise ValueError(
                f"annotation image index {int(self.annotations.image_index.max())} >= num_images {self.num_images}"
            )

    def __len__(self) -> int:
        return self.num_images

    def load_image(self, i: int) -> np.ndarray:
        return _check_image(self.loader(i), i)


def letterbox(image: np.ndarray, boxes: np.ndarray, size: int, pad_value: int = 114) -> tuple[np.ndarray, np.ndarray]:
    """Resize keeping the aspect ratio so the longer side is `size`, pad to size x size; remap xywhn boxes."""
    h, w = image.shape[:2]
    if h == size and w == size:
        return image, boxes
    scale = size / max(h, w)
    nh, nw = max(1, round(h * scale)), max(1, round(w * scale))
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    resized = cv2.resize(image, (nw, nh), interpolation=interp)
    top, left = (size - nh) // 2, (size - nw) // 2
    out = np.full((size, size, 3), pad_value, dtype=np.uint8)
    out[top : top + nh, left : left + nw] = resized
    new = np.asarray(boxes, dtype=np.float32).copy()
    new[:, 0] = (new[:, 0] * nw + left) / size
    new[:, 1] = (new[:, 1] * nh + top) / size
    new[:, 2] *= nw / size
    new[:, 3] *= nh / size
    return out, new


class DetectionDataset(Dataset):
    """A view of an AnnotatedImages source restricted to `indices`, with optional letterbox and augmentation.

    Augmentation randomness comes from a generator seeded by (seed, epoch, image id), so a sample is the same
    whatever the worker count or iteration order; call set_epoch() to vary it between epochs.
    """

    def __init__(
        self,
        data: AnnotatedImages,
        indices: Sequence[int] | np.ndarray | None = None,
        augment: Augmentation | None = None,
        image_size: int | None = None,
        seed: int = 0,
    ) -> None:
        if not isinstance(data, AnnotatedImages):
            raise ValueError(f"data must provide annotations, __len__ and load_image(i); got {type(data).__name__}")
        n = len(data)
        self.indices = np.arange(n, dtype=np.int64) if indices is None else np.asarray(indices, dtype=np.int64)
        if self.indices.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {self.indices.shape}")
        if len(self.indices) and (self.indices.min() < 0 or self.indices.max() >= n):
            bad = self.indices[(self.indices < 0) | (self.indices >= n)][0]
            raise ValueError(f"index {int(bad)} out of range for a dataset of {n} images")
        self.data, self.augment, self.image_size, self.seed = data, augment, image_size, int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Change the augmentation stream (e.g. once per local epoch)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> dict[str, Any]:
        image_id = int(self.indices[k])
        image = _check_image(self.data.load_image(image_id), image_id)
        ann = self.data.annotations
        rows = ann.rows_of(image_id)
        boxes = ann.boxes[rows].copy()
        if self.image_size is not None:
            image, boxes = letterbox(image, boxes, self.image_size)
        if self.augment is not None:
            rng = np.random.default_rng([self.seed, self.epoch, image_id])
            image, boxes = self.augment(image, boxes, rng)
            if len(boxes) != rows.stop - rows.start:
                raise ValueError(f"image {image_id}: augmentation changed the number of boxes")
        return {
            "img": torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1))),
            "cls": torch.from_numpy(ann.cls[rows].astype(np.float32)).reshape(-1, 1),
            "bboxes": torch.from_numpy(np.asarray(boxes, dtype=np.float32)).reshape(-1, 4),
            "groups": torch.from_numpy(ann.groups[rows].copy()),
            "proxy": torch.from_numpy(ann.proxy[rows].copy()),
            "image_id": image_id,
        }


def detection_collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack per-image dicts into the ultralytics-style batch of CONVENTIONS.md (plus "proxy" per box)."""
    if not items:
        raise ValueError("cannot collate an empty list of images")
    shapes = {tuple(it["img"].shape) for it in items}
    if len(shapes) != 1:
        ids = [it["image_id"] for it in items]
        raise ValueError(f"images {ids} have different shapes {sorted(shapes)}; set DetectionDataset(image_size=...)")
    img = torch.stack([it["img"] for it in items])
    img = img.float().div_(255.0) if img.dtype == torch.uint8 else img.float()
    counts = [len(it["cls"]) for it in items]
    return {
        "img": img,
        "batch_idx": torch.repeat_interleave(torch.arange(len(items), dtype=torch.float32), torch.tensor(counts)),
        "cls": torch.cat([it["cls"].reshape(-1, 1) for it in items]).float(),
        "bboxes": torch.cat([it["bboxes"].reshape(-1, 4) for it in items]).float(),
        "groups": torch.cat([it["groups"].reshape(-1) for it in items]).long(),
        "proxy": torch.cat([it["proxy"].reshape(-1) for it in items]).long(),
        "image_id": torch.tensor([it["image_id"] for it in items], dtype=torch.int64),
    }


def xywhn_to_xyxy(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Normalised centre-xywh -> pixel xyxy."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack(((cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height), -1)


def ground_truth_for(batch: dict[str, torch.Tensor], image_size: int | tuple[int, int] | None = None) -> list[dict]:
    """Per-image gt dicts {"boxes" xyxy px, "labels", "groups"(, "proxy")} from a collated batch, for metrics."""
    if image_size is None:
        height, width = batch["img"].shape[-2:]
    elif isinstance(image_size, int):
        height = width = image_size
    else:
        height, width = image_size
    n_images = len(batch["img"]) if "img" in batch else len(batch["image_id"])
    owner = batch["batch_idx"].long()
    boxes = xywhn_to_xyxy(batch["bboxes"].float(), int(height), int(width))
    labels = batch["cls"].reshape(-1).long()
    out = []
    for b in range(n_images):
        sel = owner == b
        gt = {"boxes": boxes[sel], "labels": labels[sel], "groups": batch["groups"][sel].long()}
        if "proxy" in batch:
            gt["proxy"] = batch["proxy"][sel].long()
        out.append(gt)
    return out
