"""`dataset=carla`: CARLA pedestrian frames exported in YOLO format with metadata.csv / pedestrians.csv
(layout: data/carla.py). Splits are names in metadata.csv's `split` column:

    train_splits   [finetune] -> federated client shards (train/val)   paper: 6,000 clear fine-tune frames
    test_splits    [eval]     -> test split                            paper: 7,800 frames, 13 weather conditions
    reserve_splits [attack]   -> attack reserve                        paper: 600 frames

An empty test_splits / reserve_splits carves that set out of the training frames (test_fraction / reserve_fraction,
stratified by group) instead.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.fields import setting
from resfl_lightning.data.carla import CARLA_LAYOUT, CARLA_TOWNS
from resfl_lightning.data.datasets.images import RecordsDataset, letterbox_side

CARLA_ROOT_ENV = "CARLA_ROOT"
ROLES = ("train_splits", "test_splits", "reserve_splits")

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


def disjoint_split_roles(ds: CarlaDataset) -> None:
    """At least one training split; train, test and reserve frames disjoint."""
    if not ds.train_splits:
        raise ConfigError("dataset.train_splits: name at least one CARLA split to train on (e.g. [finetune])")
    seen: dict[str, str] = {}
    for key in ROLES:
        for name in getattr(ds, key):
            if name in seen:
                raise ConfigError(f"dataset.{key}: split {name!r} is already used by dataset.{seen[name]}; "
                                  "train, test and reserve frames must be disjoint")
            seen[name] = key


def some_towns_and_classes(ds: CarlaDataset) -> None:
    if not ds.towns:
        raise ConfigError(f"dataset.towns: expected a non-empty subset of {list(CARLA_TOWNS)}, got []")
    if not ds.class_names:
        raise ConfigError("dataset.class_names: expected a non-empty list of class names, got []")


@dataclass(kw_only=True)
class CarlaDataset(RecordsDataset):
    checks = (letterbox_side, disjoint_split_roles, some_towns_and_classes)

    augment: bool = setting(False, "the fine-tune protocol uses no augmentation")
    train_splits: list[str] = setting(["finetune"], "metadata.csv splits of the client shards")
    test_splits: list[str] = setting(["eval"], "splits of the test set ([]: carved from train by test_fraction)")
    reserve_splits: list[str] = setting(["attack"], "splits of the attack reserve ([]: by reserve_fraction)")
    class_names: list[str] = setting(["person"], "class ids of the label files, in order")
    towns: list[str] = setting(list(CARLA_TOWNS), "towns whose frames are used", choices=CARLA_TOWNS)

    @property
    def roles(self) -> dict[str, tuple[str, ...]]:
        return {key: tuple(getattr(self, key)) for key in ROLES}

    def preflight(self) -> None:
        """metadata.csv and pedestrians.csv under dataset.root, listing every configured split, with its images."""
        root = self.root_path
        if root is None:
            raise ConfigError(f"dataset.root: no CARLA root given (dataset.root or env var {CARLA_ROOT_ENV}). "
                              + CARLA_MISSING_HELP)
        if not root.is_dir():
            raise ConfigError(f"dataset.root: CARLA root {root} does not exist. " + CARLA_MISSING_HELP)
        for table in ("metadata.csv", "pedestrians.csv"):
            if not (root / table).is_file():
                raise ConfigError(f"dataset.root: {root / table} is missing. " + CARLA_MISSING_HELP)
        present = _metadata_splits(root / "metadata.csv")
        for key, wanted in self.roles.items():
            for split in wanted:
                if split not in present:
                    raise ConfigError(f"dataset.{key}: no frame of split {split!r} in {root / 'metadata.csv'} "
                                      f"(splits there: {sorted(present) or 'none'}). " + CARLA_MISSING_HELP)
                folder = root / "images" / split
                if not folder.is_dir():
                    raise ConfigError(f"dataset.root: image folder {folder} of split {split!r} ({key}) is missing. "
                                      + CARLA_MISSING_HELP)

    def build(self, seed: int):
        from resfl_lightning.data.carla import load_carla
        from resfl_lightning.data.real_detection import (
            federated_records,
            federated_splits,
            rank_zero,
            record_image_groups,
            report_skipped,
        )

        roles = self.roles
        wanted = [s for names in roles.values() for s in names]
        records = load_carla(self.root_path, split=wanted, grouping=self.grouping, class_names=tuple(self.class_names),
                             on_error=self.on_error, box_tolerance=self.box_tolerance,
                             verify_images=self.verify_images, towns=tuple(self.towns))
        report_skipped("carla", records, "problems (frames dropped)")
        split_of = np.asarray(records.image_meta["split"] if "split" in records.image_meta
                              else np.empty(0, dtype=object), dtype=object)
        members = {role: np.flatnonzero(np.isin(split_of, list(names))) for role, names in roles.items()}
        for role, names in roles.items():
            if names and members[role].size == 0:
                raise ValueError(f"dataset.{role}: no usable frame of split(s) {list(names)} under {self.root_path} "
                                 "(all skipped, or none listed in metadata.csv)")
        splits = federated_splits(record_image_groups(records), self, seed, pool=members["train_splits"],
                                  test=members["test_splits"] if roles["test_splits"] else None,
                                  reserve=members["reserve_splits"] if roles["reserve_splits"] else None)
        if rank_zero():
            where = ", ".join(f"{role.removesuffix('_splits')}=" + (f"{list(names)}({len(members[role])} frames)"
                                                                      if names else "carved from train")
                              for role, names in roles.items())
            print(f"dataset carla: splits {where}", flush=True)
        return federated_records(records, splits, self)


def _metadata_splits(path: Path) -> set[str]:
    """The split names listed in metadata.csv (ConfigError when it has no `split` column)."""
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = [h.strip().lstrip("\ufeff") for h in next(reader, [])]
        if "split" not in header:
            raise ConfigError(f"dataset.root: {path} row 1 (header) has no 'split' column; {CARLA_LAYOUT}")
        col = header.index("split")
        return {row[col].strip() for row in reader if len(row) > col and row[col].strip()}
