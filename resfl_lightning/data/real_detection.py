"""FACET and CARLA as datasets of the federated trainer (`dataset=facet` / `dataset=carla`; SPEC §8).

The readers (data/facet.py, data/carla.py) give DetectionRecords; this module turns them into a LoaderImages source
(images decoded from disk with cv2, one at a time, as RGB uint8) plus Annotations, splits the images by their
image-level MST group with make_federated_splits and returns FederatedDetectionData (letterboxed to
dataset.image_size). `preflight(cfg)` runs once in the launching process before any worker starts: it checks the
config and that the data is where the config says, raising ConfigError with what to download and where to put it.

CARLA split mapping (names in metadata.csv's `split` column, configurable):
    train_splits   [finetune] -> federated client shards (train/val)   paper: 6,000 clear fine-tune frames
    test_splits    [eval]     -> test split                            paper: 7,800 frames, 13 weather conditions
    reserve_splits [attack]   -> attack reserve                        paper: 600 frames
An empty test_splits / reserve_splits carves that set out of the training frames (test_fraction / reserve_fraction,
stratified by group) instead, as for FACET, which has no predefined splits.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from omegaconf import DictConfig, OmegaConf

from resfl_lightning.config import ConfigError
from resfl_lightning.data.carla import CARLA_LAYOUT, CARLA_TOWNS, load_carla
from resfl_lightning.data.detection import Annotations, LoaderImages
from resfl_lightning.data.facet import (
    CLASS_MODES,
    FACET_IMAGE_DIRS,
    FACET_LICENCE_NOTICE,
    facet_missing_message,
    load_facet,
    resolve_facet_root,
)
from resfl_lightning.data.federated import FederatedDetectionData, LoaderSettings
from resfl_lightning.data.mst import GROUPINGS, num_groups
from resfl_lightning.data.partition import ClientSplit, FederatedSplits, image_groups, make_federated_splits
from resfl_lightning.data.records import ON_ERROR, DetectionRecords

CARLA_ROOT_ENV = "CARLA_ROOT"
PARTITIONS = ("iid", "dirichlet")
_MODEL_STRIDE = 32  # YOLOv8's largest stride: the letterboxed side must be a multiple of it
_MAX_SKIPPED_SHOWN = 5

CARLA_MISSING_HELP = (
    "CARLA frames are not downloaded: export them from the CARLA simulator (towns Town01/Town03/Town05, pedestrians "
    "with a Monk Skin Tone label, weather clear/cloud/rain/fog at 0/25/50/75/100 %) in YOLO format, then pass that "
    f"folder as dataset.root=<folder> (or set {CARLA_ROOT_ENV}). Expected layout:\n"
    "  <root>/images/<split>/<frame>.png|.jpg|.jpeg\n"
    "  <root>/labels/<split>/<frame>.txt   one line per pedestrian 'cls xc yc w h [ped_id]' (normalised); "
    "empty = none\n"
    "  <root>/metadata.csv                 frame,split,town,weather,intensity (one row per frame)\n"
    "  <root>/pedestrians.csv              frame,ped_index,mst (ped_index = 0-based box in the label file)\n"
    "Splits used by default: finetune -> client train/val shards, eval -> test split, attack -> attack reserve "
    "(dataset.train_splits / test_splits / reserve_splits)."
)

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
            raise ValueError(f"image {i}: cannot read {path} (missing, unreadable or corrupt)")
        if bgr.shape[:2] != tuple(int(v) for v in self.sizes[i]):
            raise ValueError(f"image {i}: {path} decodes to {bgr.shape[1]}x{bgr.shape[0]} (w x h) but was indexed as "
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
# Entry points used by data/federated.py's registry


def preflight(cfg: DictConfig) -> None:
    """Fast checks before any process starts: config values, data present; FACET shows its licence notice."""
    if cfg.name == "facet":
        _preflight_facet(cfg)
    elif cfg.name == "carla":
        _preflight_carla(cfg)
    else:
        raise ConfigError(f"dataset.name: real_detection handles 'facet' and 'carla', got {cfg.name!r}")


def build(cfg: DictConfig, seed: int) -> FederatedDetectionData:
    """FederatedDetectionData for `dataset=facet` or `dataset=carla` (called on every rank)."""
    if cfg.name == "facet":
        return build_facet(cfg, seed)
    if cfg.name == "carla":
        return build_carla(cfg, seed)
    raise ConfigError(f"dataset.name: real_detection handles 'facet' and 'carla', got {cfg.name!r}")


def build_facet(cfg: DictConfig, seed: int) -> FederatedDetectionData:
    """FACET: all annotated images, IID (or Dirichlet) client shards by image MST group, held-out test and reserve."""
    _check_common(cfg)
    show_facet_notice(force=False)
    records = load_facet(_root(cfg), classes=cfg.classes, grouping=cfg.grouping, on_error=cfg.on_error,
                         box_tolerance=float(cfg.box_tolerance), verify_images=bool(cfg.verify_images))
    _report_skipped("facet", records, "annotation rows")
    if records.num_images == 0:
        raise ValueError(f"FACET at {_root(cfg)}: no usable image (all rows were skipped or the CSV is empty)")
    splits = federated_splits(record_image_groups(records), cfg, seed)
    return _federated(records, splits, cfg)


def build_carla(cfg: DictConfig, seed: int) -> FederatedDetectionData:
    """CARLA: train/test/reserve from metadata.csv's split column (see the module docstring)."""
    _check_common(cfg)
    roles = carla_split_roles(cfg)
    wanted = [s for names in roles.values() for s in names]
    records = load_carla(_root(cfg), split=wanted, grouping=cfg.grouping, class_names=tuple(cfg.class_names),
                         on_error=cfg.on_error, box_tolerance=float(cfg.box_tolerance),
                         verify_images=bool(cfg.verify_images), towns=tuple(cfg.towns))
    _report_skipped("carla", records, "problems (frames dropped)")
    split_of = np.asarray(records.image_meta.get("split", np.empty(0, dtype=object)), dtype=object)
    members = {role: np.flatnonzero(np.isin(split_of, list(names))) for role, names in roles.items()}
    for role, names in roles.items():
        if names and members[role].size == 0:
            raise ValueError(f"dataset.{role}: no usable frame of split(s) {list(names)} under {_root(cfg)} "
                             "(all skipped, or none listed in metadata.csv)")
    groups = record_image_groups(records)
    splits = federated_splits(groups, cfg, seed, pool=members["train_splits"],
                              test=members["test_splits"] if roles["test_splits"] else None,
                              reserve=members["reserve_splits"] if roles["reserve_splits"] else None)
    if _rank_zero():
        where = ", ".join(f"{role.removesuffix('_splits')}=" + (f"{list(names)}({len(members[role])} frames)" if names
                                                                  else "carved from train")
                          for role, names in roles.items())
        print(f"dataset carla: splits {where}", flush=True)
    return _federated(records, splits, cfg)


def federated_splits(groups: np.ndarray, cfg: DictConfig, seed: int, pool: np.ndarray | None = None,
                     test: np.ndarray | None = None, reserve: np.ndarray | None = None) -> FederatedSplits:
    """SPEC §8 splits over images: make_federated_splits on `pool` (default: all images); a given `test` / `reserve`
    index set replaces the one it would carve out of the pool (CARLA's predefined eval / attack frames)."""
    pool = np.arange(len(groups), dtype=np.int64) if pool is None else np.asarray(pool, dtype=np.int64)
    if len(pool) < int(cfg.num_clients):
        raise ValueError(f"dataset.num_clients: {cfg.num_clients} clients but only {len(pool)} training images")
    inner = make_federated_splits(
        groups[pool], num_clients=int(cfg.num_clients),
        test_fraction=0.0 if test is not None else float(cfg.test_fraction),
        reserve_fraction=0.0 if reserve is not None else float(cfg.reserve_fraction),
        val_fraction=float(cfg.val_fraction), partition=cfg.partition, alpha=float(cfg.dirichlet_alpha), seed=seed,
        dirichlet_centre=cfg.get("dirichlet_centre", "uniform"))
    return FederatedSplits(
        test=np.sort(pool[inner.test] if test is None else np.asarray(test, dtype=np.int64)),
        reserve=np.sort(pool[inner.reserve] if reserve is None else np.asarray(reserve, dtype=np.int64)),
        clients=[ClientSplit(pool[c.train], pool[c.val]) for c in inner.clients],
        partition=inner.partition, alpha=inner.alpha, seed=inner.seed, h_tv=inner.h_tv)


def carla_split_roles(cfg: DictConfig) -> dict[str, tuple[str, ...]]:
    """{"train_splits": (...), "test_splits": (...), "reserve_splits": (...)} from the config; ConfigError if bad."""
    roles = {}
    for key in ("train_splits", "test_splits", "reserve_splits"):
        value = cfg.get(key)
        if value is None:
            value = []
        elif isinstance(value, str):
            value = [value]
        else:
            value = list(OmegaConf.to_container(value, resolve=True)) if OmegaConf.is_config(value) else list(value)
        if not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"dataset.{key}: expected a list of split names, got {value!r}")
        roles[key] = tuple(value)
    if not roles["train_splits"]:
        raise ConfigError("dataset.train_splits: name at least one CARLA split to train on (e.g. [finetune])")
    seen: dict[str, str] = {}
    for key, names in roles.items():
        for name in names:
            if name in seen:
                raise ConfigError(f"dataset.{key}: split {name!r} is already used by dataset.{seen[name]}; "
                                  "train, test and reserve frames must be disjoint")
            seen[name] = key
    return roles


def show_facet_notice(force: bool = True) -> None:
    """Print FACET's licence notice on rank zero (force=False: only if this process has not shown it yet)."""
    global _notice_shown
    if not _rank_zero() or (_notice_shown and not force):
        return
    print(f"NOTICE (FACET licence): {FACET_LICENCE_NOTICE}", flush=True)
    _notice_shown = True


# --------------------------------------------------------------------------------------------------------------------
# Helpers


def _federated(records: DetectionRecords, splits: FederatedSplits, cfg: DictConfig) -> FederatedDetectionData:
    return FederatedDetectionData(source=records_to_images(records), splits=splits,
                                  num_groups=num_groups(cfg.grouping), num_classes=len(records.class_names),
                                  batch_size=int(cfg.batch_size), image_size=int(cfg.image_size),
                                  augment=bool(cfg.augment), loader=LoaderSettings.from_config(cfg))


def _root(cfg: DictConfig) -> Path | None:
    root = cfg.get("root")
    return None if root is None or str(root).strip() == "" else Path(str(root)).expanduser()


def _rank_zero() -> bool:
    """Global rank zero: Fabric's rank once launched, before that the launcher's env (workers get LOCAL_RANK etc.)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0 and os.environ.get("NODE_RANK", "0") in ("", "0")


def _report_skipped(name: str, records: DetectionRecords, what: str) -> None:
    if not records.num_skipped or not _rank_zero():
        return
    shown = "\n  ".join(records.skipped[:_MAX_SKIPPED_SHOWN])
    more = records.num_skipped - min(records.num_skipped, _MAX_SKIPPED_SHOWN)
    print(f"dataset {name}: skipped {records.num_skipped} {what} (dataset.on_error=skip); kept "
          f"{records.num_images} images, {records.num_persons} persons. First:\n  {shown}"
          + (f"\n  ... and {more} more" if more else ""), flush=True)


def _check_common(cfg: DictConfig) -> None:
    """Config values both datasets read, each error naming its key."""
    size = cfg.get("image_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < _MODEL_STRIDE or size % _MODEL_STRIDE:
        raise ConfigError(f"dataset.image_size: must be a positive multiple of {_MODEL_STRIDE} (images are "
                          f"letterboxed to image_size x image_size for YOLOv8), got {size!r}")
    if cfg.get("grouping") not in GROUPINGS:
        raise ConfigError(f"dataset.grouping: must be one of {', '.join(GROUPINGS)}, got {cfg.get('grouping')!r}")
    if cfg.get("on_error") not in ON_ERROR:
        raise ConfigError(f"dataset.on_error: must be one of {', '.join(ON_ERROR)}, got {cfg.get('on_error')!r}")
    if cfg.get("partition") not in PARTITIONS:
        raise ConfigError(f"dataset.partition: must be one of {', '.join(PARTITIONS)}, got {cfg.get('partition')!r}")
    if not float(cfg.box_tolerance) >= 0:
        raise ConfigError(f"dataset.box_tolerance: must be >= 0, got {cfg.box_tolerance}")
    for key in ("test_fraction", "reserve_fraction", "val_fraction"):
        if not 0.0 <= float(cfg[key]) < 1.0:
            raise ConfigError(f"dataset.{key}: must be in [0, 1), got {cfg[key]}")
    if cfg.name == "facet" and cfg.get("classes") not in CLASS_MODES:
        raise ConfigError(f"dataset.classes: must be one of {', '.join(CLASS_MODES)}, got {cfg.get('classes')!r}")


def _preflight_facet(cfg: DictConfig) -> None:
    _check_common(cfg)
    root = _root(cfg)
    hint = "\nSet it with dataset.root=<folder>, e.g. make train DATASET=facet ARGS='dataset.root=/data/facet'."
    try:
        root = resolve_facet_root(root)
    except FileNotFoundError as err:
        raise ConfigError(f"dataset.root: {err}{hint}") from None
    if not any((root / d).is_dir() for d in FACET_IMAGE_DIRS):
        raise ConfigError(f"dataset.root: none of the image folders {', '.join(FACET_IMAGE_DIRS)} exists under "
                          f"{root}. {facet_missing_message(root)}{hint}")
    show_facet_notice(force=True)


def _preflight_carla(cfg: DictConfig) -> None:
    _check_common(cfg)
    roles = carla_split_roles(cfg)
    names = cfg.get("class_names")
    if names is None or isinstance(names, str) or len(names) < 1:
        raise ConfigError(f"dataset.class_names: expected a non-empty list of class names, got {names!r}")
    unknown = [t for t in cfg.get("towns") or [] if t not in CARLA_TOWNS]
    if not cfg.get("towns") or unknown:
        raise ConfigError(f"dataset.towns: expected a non-empty subset of {list(CARLA_TOWNS)}, got "
                          f"{cfg.get('towns')!r}")
    root = _root(cfg)
    if root is None:
        raise ConfigError(f"dataset.root: no CARLA root given (dataset.root or env var {CARLA_ROOT_ENV}). "
                          + CARLA_MISSING_HELP)
    if not root.is_dir():
        raise ConfigError(f"dataset.root: CARLA root {root} does not exist. " + CARLA_MISSING_HELP)
    for table in ("metadata.csv", "pedestrians.csv"):
        if not (root / table).is_file():
            raise ConfigError(f"dataset.root: {root / table} is missing. " + CARLA_MISSING_HELP)
    present = _metadata_splits(root / "metadata.csv")
    for key, wanted in roles.items():
        for split in wanted:
            if split not in present:
                raise ConfigError(f"dataset.{key}: no frame of split {split!r} in {root / 'metadata.csv'} (splits "
                                  f"there: {sorted(present) or 'none'}). " + CARLA_MISSING_HELP)
            folder = root / "images" / split
            if not folder.is_dir():
                raise ConfigError(f"dataset.root: image folder {folder} of split {split!r} ({key}) is missing. "
                                  + CARLA_MISSING_HELP)


def _metadata_splits(path: Path) -> set[str]:
    """The split names listed in metadata.csv (ConfigError when it has no `split` column)."""
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = [h.strip().lstrip("\ufeff") for h in next(reader, [])]
        if "split" not in header:
            raise ConfigError(f"dataset.root: {path} row 1 (header) has no 'split' column; {CARLA_LAYOUT}")
        col = header.index("split")
        return {row[col].strip() for row in reader if len(row) > col and row[col].strip()}

