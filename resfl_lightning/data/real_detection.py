"""Records read from disk (FACET, CARLA; data/records.py) as the trainer's federated detection data.

The readers (data/facet.py, data/carla.py) give DetectionRecords; this module turns them into a LoaderImages source
(images decoded from disk with cv2, one at a time, as RGB uint8) plus Annotations, splits the images by their
image-level MST group with make_federated_splits and returns FederatedDetectionData (letterboxed to
dataset.image_size). The datasets themselves are resfl_lightning/data/datasets/facet.py and carla.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.data.detection import Annotations, LoaderImages
from resfl_lightning.data.errors import ImageError
from resfl_lightning.data.facet import FACET_LICENCE_NOTICE
from resfl_lightning.data.federated import FederatedDetectionData
from resfl_lightning.data.mst import num_groups
from resfl_lightning.data.partition import ClientSplit, FederatedSplits, image_groups, make_federated_splits
from resfl_lightning.data.records import DetectionRecords

_MAX_SKIPPED_SHOWN = 5
_notice_shown = False  # the FACET licence notice, once per process (preflight shows it again for each run)


# --------------------------------------------------------------------------------------------------------------------
# Records -> training container


@dataclass
class ImageFiles:
    """loader(i) for LoaderImages: decode image i from disk with cv2 as RGB uint8, checking its recorded size."""

    paths: list[Path]
    sizes: np.ndarray  # int64 (N, 2) (height, width) from the file header, as the boxes were normalised with

    def __call__(self, i: int) -> np.ndarray:
        path = self.paths[i]
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)  # honours EXIF orientation, like records.read_image_size
        if bgr is None:
            raise ImageError(f"image {i}: cannot read {path} (missing, unreadable or corrupt)")
        if bgr.shape[:2] != tuple(int(v) for v in self.sizes[i]):
            raise ImageError(f"image {i}: {path} decodes to {bgr.shape[1]}x{bgr.shape[0]} (w x h) but was indexed as "
                            f"{self.sizes[i][1]}x{self.sizes[i][0]}; was the file replaced after loading?")
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


@dataclass
class RecordImages(LoaderImages):
    """LoaderImages over DetectionRecords; keeps the records (paths, per-image metadata, skipped rows) for callers."""

    records: DetectionRecords | None = None


def records_to_images(records: DetectionRecords) -> RecordImages:
    """The training source of DetectionRecords: lazy RGB images + Annotations (extra: mst and the per-person meta)."""
    extra = {"mst": records.mst, **{k: np.asarray(v) for k, v in records.person_meta.items()}}
    annotations = Annotations(records.image_index, records.cls, records.boxes_xywhn, records.groups, records.proxy,
                              extra=extra)
    return RecordImages(num_images=records.num_images,
                        loader=ImageFiles(list(records.image_paths), np.asarray(records.image_sizes)),
                        annotations=annotations, records=records)


def record_image_groups(records: DetectionRecords) -> np.ndarray:
    """One group per image (most frequent known group of its persons, -1 when none): the partition strata."""
    return image_groups(records.image_index, records.groups, records.num_images)


# --------------------------------------------------------------------------------------------------------------------
# Splits and the training container


def federated_splits(groups: np.ndarray, ds: Any, seed: int, pool: np.ndarray | None = None,
                     test: np.ndarray | None = None, reserve: np.ndarray | None = None,
                     client_labels: np.ndarray | None = None) -> FederatedSplits:
    """Splits over images with the dataset's (`ds`) fractions: make_federated_splits on `pool` (default: all
    images); a given `test` / `reserve` index set replaces the one it would carve out of the pool (CARLA's
    predefined eval / attack frames); client_labels: each image's partition-column value (partition=column)."""
    pool = np.arange(len(groups), dtype=np.int64) if pool is None else np.asarray(pool, dtype=np.int64)
    if len(pool) < ds.num_clients:
        raise ConfigError(f"dataset.num_clients: {ds.num_clients} clients but only {len(pool)} training images")
    inner = make_federated_splits(
        groups[pool], num_clients=ds.num_clients,
        test_fraction=0.0 if test is not None else ds.test_fraction,
        reserve_fraction=0.0 if reserve is not None else ds.reserve_fraction,
        val_fraction=ds.val_fraction, partition=ds.partition, alpha=ds.dirichlet_alpha, seed=seed,
        dirichlet_centre=ds.dirichlet_centre, small_clients=ds.small_clients,
        client_labels=None if client_labels is None else np.asarray(client_labels)[pool])
    return FederatedSplits(
        test=np.sort(pool[inner.test] if test is None else np.asarray(test, dtype=np.int64)),
        reserve=np.sort(pool[inner.reserve] if reserve is None else np.asarray(reserve, dtype=np.int64)),
        clients=[ClientSplit(pool[c.train], pool[c.val]) for c in inner.clients],
        partition=inner.partition, alpha=inner.alpha, seed=inner.seed, h_tv=inner.h_tv,
        client_names=inner.client_names)


def show_facet_notice(force: bool = True) -> None:
    """Print FACET's licence notice on rank zero (force=False: only if this process has not shown it yet)."""
    global _notice_shown
    if not rank_zero() or (_notice_shown and not force):
        return
    print(f"NOTICE (FACET licence): {FACET_LICENCE_NOTICE}", flush=True)
    _notice_shown = True


# --------------------------------------------------------------------------------------------------------------------
# Helpers


def federated_records(records: DetectionRecords, splits: FederatedSplits, ds: Any) -> FederatedDetectionData:
    """The training container of the records, letterboxed to the dataset's image_size."""
    return FederatedDetectionData(source=records_to_images(records), splits=splits,
                                  num_groups=num_groups(ds.grouping), num_classes=len(records.class_names),
                                  batch_size=ds.batch_size, image_size=ds.image_size, augment=ds.augment,
                                  loader=ds.loader)


def rank_zero() -> bool:
    """Global rank zero: Fabric's rank once launched, before that the launcher's env (workers get LOCAL_RANK etc.)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0 and os.environ.get("NODE_RANK") in (None, "", "0")


def report_skipped(name: str, records: DetectionRecords, what: str) -> None:
    if not records.num_skipped or not rank_zero():
        return
    shown = "\n  ".join(records.skipped[:_MAX_SKIPPED_SHOWN])
    more = records.num_skipped - min(records.num_skipped, _MAX_SKIPPED_SHOWN)
    print(f"dataset {name}: skipped {records.num_skipped} {what} (dataset.on_error=skip); kept "
          f"{records.num_images} images, {records.num_persons} persons. First:\n  {shown}"
          + (f"\n  ... and {more} more" if more else ""), flush=True)
