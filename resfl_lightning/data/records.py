"""`DetectionRecords`: the in-memory table every detection reader (FACET, CARLA) returns.

One row per image (path, size, optional per-image metadata) and one row per person (image index, class, normalised
box, Monk Skin Tone value, sensitive group, proxy attribute, optional per-person metadata). The training dataset is
built from it; nothing here loads pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from resfl_lightning.data.errors import AnnotationError, ImageError, MissingDataFile
from resfl_lightning.data.mst import group_of_mst

# Tolerance for boxes touching the image border after float32 rounding.
_BOX_EPS = 1e-4


def mst_to_group(mst: np.ndarray | Sequence[int], grouping: str = "mst10") -> np.ndarray:
    """Map record MST values (1..10, 0 = unknown) to 0-based groups (-1 = unknown) with `mst.group_of_mst`."""
    values = np.asarray(mst, dtype=np.int64)
    if ((values < 0) | (values > 10)).any():
        raise ValueError(f"MST values must be 0 (unknown) or 1..10, got {values[(values < 0) | (values > 10)][:5]}")
    return group_of_mst(np.where(values == 0, -1, values), grouping)


@dataclass
class DetectionRecords:
    """Images and the persons annotated in them, with per-person skin tone, group and proxy labels.

    Per-image arrays have length N = len(image_paths); per-person arrays have length M. `image_meta` holds extra
    per-image arrays (e.g. CARLA town/weather), `person_meta` extra per-person arrays (e.g. FACET person_id).
    """

    image_paths: list[Path]
    image_sizes: np.ndarray  # int64 (N, 2) as (height, width) in pixels
    image_index: np.ndarray  # int64 (M,) index into image_paths
    cls: np.ndarray  # int64 (M,) index into class_names
    boxes_xywhn: np.ndarray  # float32 (M, 4) normalised centre-x, centre-y, width, height
    mst: np.ndarray  # int64 (M,) Monk Skin Tone 1..10, 0 = unknown
    groups: np.ndarray  # int64 (M,) sensitive group, -1 = unknown
    proxy: np.ndarray  # int64 (M,) proxy attribute id (lighting, weather condition), -1 = unknown
    class_names: list[str]
    skipped: list[str] = field(default_factory=list)
    image_meta: dict[str, np.ndarray] = field(default_factory=dict)
    person_meta: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_images(self) -> int:
        return len(self.image_paths)

    @property
    def num_persons(self) -> int:
        return len(self.image_index)

    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    def persons_of(self, image: int) -> np.ndarray:
        """Indices of the persons annotated in one image."""
        return np.flatnonzero(self.image_index == image)

    def validate(self) -> DetectionRecords:
        """Check array shapes, dtypes and value ranges; raise ValueError naming the first offending field."""
        n = len(self.image_paths)
        sizes = np.asarray(self.image_sizes)
        if sizes.shape != (n, 2) or sizes.dtype != np.int64:
            raise ValueError(f"image_sizes must be int64 ({n}, 2), got {sizes.dtype} {sizes.shape}")
        if n and (sizes <= 0).any():
            bad = int(np.flatnonzero((sizes <= 0).any(axis=1))[0])
            raise ValueError(f"image_sizes must be positive; image {bad} ({self.image_paths[bad]}) has {sizes[bad]}")
        m = len(self.image_index)
        for name in ("image_index", "cls", "mst", "groups", "proxy"):
            arr = np.asarray(getattr(self, name))
            if arr.shape != (m,) or arr.dtype != np.int64:
                raise ValueError(f"{name} must be int64 ({m},), got {arr.dtype} {arr.shape}")
        boxes = np.asarray(self.boxes_xywhn)
        if boxes.shape != (m, 4) or boxes.dtype != np.float32:
            raise ValueError(f"boxes_xywhn must be float32 ({m}, 4), got {boxes.dtype} {boxes.shape}")
        _check_range("image_index", self.image_index, 0, n - 1)
        _check_range("cls", self.cls, 0, len(self.class_names) - 1)
        _check_range("mst", self.mst, 0, 10)
        _check_range("groups", self.groups, -1, None)
        _check_range("proxy", self.proxy, -1, None)
        if m:
            if ((self.mst == 0) & (self.groups != -1)).any():
                bad = int(np.flatnonzero((self.mst == 0) & (self.groups != -1))[0])
                raise ValueError(f"person {bad} has unknown MST (0) but group {self.groups[bad]}")
            if not np.isfinite(boxes).all():
                bad = int(np.flatnonzero(~np.isfinite(boxes).all(1))[0])
                raise ValueError(f"boxes_xywhn has non-finite values at person {bad}")
            lo = boxes[:, :2] - boxes[:, 2:] / 2
            hi = boxes[:, :2] + boxes[:, 2:] / 2
            bad = (boxes[:, 2:] <= 0).any(1) | (lo < -_BOX_EPS).any(1) | (hi > 1 + _BOX_EPS).any(1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"person {i} (image {self.image_paths[self.image_index[i]]}) has a box outside "
                                 f"[0, 1] or empty: xywhn={boxes[i].tolist()}")
        for key, arr in self.image_meta.items():
            if len(arr) != n:
                raise ValueError(f"image_meta[{key!r}] has length {len(arr)}, expected {n} images")
        for key, arr in self.person_meta.items():
            if len(arr) != m:
                raise ValueError(f"person_meta[{key!r}] has length {len(arr)}, expected {m} persons")
        return self

    def subset(self, image_indices: Sequence[int] | np.ndarray) -> DetectionRecords:
        """Records of the given images, in the given order (re-indexed 0..k-1), with their persons; keeps `skipped`."""
        idx = np.asarray(image_indices, dtype=np.int64).reshape(-1)
        n = len(self.image_paths)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"image indices must lie in [0, {n}), got min {idx.min()} max {idx.max()}")
        if len(np.unique(idx)) != len(idx):
            raise ValueError("image indices passed to subset() contain duplicates")
        new_of_old = np.full(n, -1, dtype=np.int64)
        new_of_old[idx] = np.arange(len(idx))
        new_image = new_of_old[self.image_index]
        keep = np.flatnonzero(new_image >= 0)
        keep = keep[np.argsort(new_image[keep], kind="stable")]  # persons grouped by their new image order
        return DetectionRecords(
            image_paths=[self.image_paths[i] for i in idx],
            image_sizes=self.image_sizes[idx],
            image_index=new_image[keep],
            cls=self.cls[keep],
            boxes_xywhn=self.boxes_xywhn[keep],
            mst=self.mst[keep],
            groups=self.groups[keep],
            proxy=self.proxy[keep],
            class_names=list(self.class_names),
            skipped=list(self.skipped),
            image_meta={k: np.asarray(v)[idx] for k, v in self.image_meta.items()},
            person_meta={k: np.asarray(v)[keep] for k, v in self.person_meta.items()},
        )

    def boxes_xyxy(self) -> np.ndarray:
        """Person boxes as float32 (M, 4) xyxy pixels of their own image."""
        hw = self.image_sizes[self.image_index].astype(np.float64)
        b = self.boxes_xywhn.astype(np.float64)
        x1 = (b[:, 0] - b[:, 2] / 2) * hw[:, 1]
        y1 = (b[:, 1] - b[:, 3] / 2) * hw[:, 0]
        x2 = (b[:, 0] + b[:, 2] / 2) * hw[:, 1]
        y2 = (b[:, 1] + b[:, 3] / 2) * hw[:, 0]
        return np.stack([x1, y1, x2, y2], axis=1).astype(np.float32)


def xywh_pixels_to_xywhn(x: float, y: float, w: float, h: float, width: int, height: int) -> tuple[float, ...]:
    """Top-left pixel box (COCO bbox) -> normalised centre box (YOLO)."""
    return ((x + w / 2) / width, (y + h / 2) / height, w / width, h / height)


def clip_box_xyxy(
    x1: float, y1: float, x2: float, y2: float, width: int, height: int, tolerance: float
) -> tuple[float, float, float, float] | str:
    """Clip a pixel box to the image; return an error string when it sticks out by more than `tolerance`.

    `tolerance` is a fraction of the image side (plus 1 px); boxes within it are clipped, larger overhangs and boxes
    that end up empty are treated as corrupt annotations.
    """
    tol_x = tolerance * width + 1.0
    tol_y = tolerance * height + 1.0
    if x1 < -tol_x or y1 < -tol_y or x2 > width + tol_x or y2 > height + tol_y:
        return (f"box xyxy=({x1:g}, {y1:g}, {x2:g}, {y2:g}) lies outside the {width}x{height} image "
                f"by more than the tolerance ({tolerance:g} of the side + 1 px)")
    cx1, cy1 = min(max(x1, 0.0), width), min(max(y1, 0.0), height)
    cx2, cy2 = min(max(x2, 0.0), width), min(max(y2, 0.0), height)
    if cx2 - cx1 <= 0 or cy2 - cy1 <= 0:
        return f"box xyxy=({x1:g}, {y1:g}, {x2:g}, {y2:g}) is empty inside the {width}x{height} image"
    return cx1, cy1, cx2, cy2


def _check_range(name: str, values: np.ndarray, lo: int, hi: int | None) -> None:
    values = np.asarray(values)
    if not values.size:
        return
    bad = values < lo if hi is None else (values < lo) | (values > hi)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {bound}; entry {i} is {values[i]}")


def read_image_size(path: Path, verify: bool = False) -> tuple[int, int]:
    """(height, width) of an image from its header, without decoding pixels unless `verify`.

    EXIF orientations 5-8 swap the sides, as decoders that honour EXIF (cv2.imread, ultralytics) see the image.
    Raises ImageError (a ValueError) for an unreadable/corrupt file (and, with `verify`, for truncated pixel data),
    MissingDataFile for a missing one.
    """
    try:
        with Image.open(path) as im:
            width, height = im.size
            exif = im.getexif()
            orientation = exif[0x0112] if 0x0112 in exif else 1  # no orientation tag: stored upright
            if verify:
                im.load()
    except FileNotFoundError:
        raise MissingDataFile(f"{path}: image not found") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, ImportError) as err:
        # ImportError: ultralytics patches Image.open to retry unknown files as HEIF (pi_heif is not installed).
        raise ImageError(f"corrupt or unreadable image {path}: {err}") from err
    if width <= 0 or height <= 0:
        raise ImageError(f"image {path} has an empty size {width}x{height}")
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    return int(height), int(width)


ON_ERROR = ("raise", "skip")


class BadInput:
    """Bad-input policy of the readers: raise at the first problem (on_error="raise") or record it ("skip")."""

    def __init__(self, on_error: str) -> None:
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self.on_error = on_error
        self.messages: list[str] = []

    def report(self, message: str, missing_file: bool = False) -> None:
        """Raise MissingDataFile / AnnotationError (a FileNotFoundError / ValueError), or keep the message when
        skipping."""
        if self.on_error == "raise":
            raise (MissingDataFile if missing_file else AnnotationError)(message)
        self.messages.append(message)
