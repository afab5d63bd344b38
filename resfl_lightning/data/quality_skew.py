"""The `quality_skew` benchmark scenario: equal group mixes, but on some clients one group's persons are harder.

The way one city's cameras differ from another's: on a fixed, seeded set of clients the target group's persons are
dimmed in every image of the client's train and validation splits (pixels inside their boxes scaled by `dim`), and a
share `missing_rate` of those persons' training boxes is missing from the annotations. The test split, the attack
reserve and every other client are untouched, so every method sees the same data and the scenario differs from IID
only where a fairness-aware aggregation has something to act on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from resfl_lightning.config.sections import QualitySkewSettings
from resfl_lightning.data.detection import Annotations
from resfl_lightning.data.partition import count_from_fraction

_STREAM = 0x515353  # RNG stream tag: independent of every other use of the run seed


def skewed_clients(num_clients: int, fraction: float, seed: int) -> list[int]:
    k = count_from_fraction(num_clients, fraction)
    return sorted(int(i) for i in np.random.default_rng([seed, _STREAM]).choice(num_clients, size=k, replace=False))


def minority_group(ann: Annotations, images: np.ndarray, num_groups: int) -> int:
    """The group with the fewest persons on the given images (ties: the higher group id)."""
    groups = ann.groups[np.isin(ann.image_index, images) & (ann.groups >= 0)]
    counts = np.bincount(groups, minlength=num_groups)
    return int(num_groups - 1 - np.argmin(counts[::-1]))


@dataclass
class SkewedImages:
    """The source images with the target group dimmed on the skewed clients' images, and thinned annotations."""

    source: Any
    annotations: Annotations
    dim_boxes: dict[int, np.ndarray]  # image index -> xywhn boxes to dim
    dim: float = 1.0

    def __len__(self) -> int:
        return len(self.source)

    def load_image(self, i: int) -> np.ndarray:
        image = self.source.load_image(i)
        boxes = self.dim_boxes.get(int(i))
        if boxes is None:
            return image
        out = image.astype(np.float32)
        h, w = image.shape[:2]
        for cx, cy, bw, bh in boxes:
            x0, x1 = int(max(0, (cx - bw / 2) * w)), int(min(w, np.ceil((cx + bw / 2) * w)))
            y0, y1 = int(max(0, (cy - bh / 2) * h)), int(min(h, np.ceil((cy + bh / 2) * h)))
            out[y0:y1, x0:x1] *= self.dim
        return np.clip(out, 0, 255).astype(image.dtype)

    def __getattr__(self, name: str) -> Any:  # other attributes of the source (e.g. `mst`) pass through
        if name == "source":
            raise AttributeError(name)
        return getattr(self.source, name)


def apply_quality_skew(data: Any, settings: QualitySkewSettings, seed: int) -> tuple[Any, dict[str, Any]]:
    """The federated detection data under the scenario, and a summary (clients, group, boxes dimmed / missing)."""
    if not (hasattr(data, "source") and hasattr(data.source, "annotations")):
        raise ValueError("scenario=quality_skew is defined for detection data (dim persons, missing boxes); "
                         f"{type(data).__name__} has no per-person annotations")
    ann: Annotations = data.source.annotations
    clients = skewed_clients(data.num_clients, settings.client_fraction, seed)
    train_all = np.concatenate([c.train for c in data.splits.clients])
    group = minority_group(ann, train_all, data.num_groups) if settings.group is None else settings.group
    if not 0 <= group < data.num_groups:
        raise ValueError(f"dataset.quality_skew.group must lie in 0..{data.num_groups - 1}, got {group}")
    skew_images = np.concatenate([np.concatenate([data.splits.clients[c].train, data.splits.clients[c].val])
                                  for c in clients])
    target = (ann.groups == group) & np.isin(ann.image_index, skew_images)
    dim_boxes: dict[int, list] = {}
    for row in np.flatnonzero(target):
        dim_boxes.setdefault(int(ann.image_index[row]), []).append(ann.boxes[row])
    train_target = np.flatnonzero(target & np.isin(ann.image_index, np.concatenate(
        [data.splits.clients[c].train for c in clients])))
    rng = np.random.default_rng([seed, _STREAM, 1])
    missing = rng.choice(train_target, size=int(round(settings.missing_rate * len(train_target))), replace=False)
    keep = np.ones(len(ann.image_index), dtype=bool)
    keep[missing] = False
    view = SkewedImages(data.source, ann.select(keep), {k: np.stack(v) for k, v in dim_boxes.items()},
                        dim=settings.dim)
    summary = {"clients": clients, "group": group, "persons_dimmed": int(target.sum()),
               "boxes_missing": int(len(missing))}
    return dataclasses.replace(data, source=view), summary
