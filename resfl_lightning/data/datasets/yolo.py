"""`dataset=yolo`: a detection set in the ultralytics format (data.yaml + YOLO .txt labels) with a groups CSV
(data/yolo.py). Clients share the `train` images (iid, dirichlet by image group, or one client per value of the
groups file's partition column); the test split is the `test` folder, else `val`; the attack reserve is carved from
the training images."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.fields import setting
from resfl_lightning.data.datasets.images import ImageDataset, letterbox_side


@dataclass(kw_only=True)
class YoloDataset(ImageDataset):
    checks = (letterbox_side,)
    supports_column_partition = True

    data: str | None = setting(None, "the ultralytics data.yaml")
    groups_file: str | None = setting(None, "CSV: image, group, and box (label row) or x, y, w, h, or neither "
                                      "(one group per image)")
    groups: list[str] | None = setting(None, "the groups in group-id order (null: sorted)")
    person_class: int = setting(0, "the class id of persons in the label files (other classes are ignored)", ge=0)
    box_tolerance: float = setting(0.001, "a box may pass the image border by this much (normalised)", ge=0)

    def paths(self) -> tuple[Path, Path]:
        if not self.data:
            raise ConfigError("dataset.data: not set; point it at the ultralytics data.yaml")
        if not self.groups_file:
            raise ConfigError("dataset.groups_file: not set; give the CSV naming each person's (or image's) group")
        return Path(str(self.data)).expanduser(), Path(str(self.groups_file)).expanduser()

    def preflight(self) -> None:
        for key, path in zip(("data", "groups_file"), self.paths(), strict=True):
            if not path.is_file():
                raise ConfigError(f"dataset.{key}: {path} does not exist")

    def group_names(self, seed: int) -> tuple[str, ...]:
        """dataset.groups, else the groups file's groups sorted (its images and labels are not read)."""
        from resfl_lightning.data.yolo import read_group_names

        return tuple(read_group_names(self.paths()[1], self.groups))

    def build(self, seed: int):
        from resfl_lightning.data.datasets.csv import check_client_count
        from resfl_lightning.data.detection import Annotations, LoaderImages
        from resfl_lightning.data.federated import FederatedDetectionData
        from resfl_lightning.data.partition import image_groups
        from resfl_lightning.data.real_detection import ImageFiles, federated_splits
        from resfl_lightning.data.yolo import load_yolo

        data_yaml, groups_file = self.paths()
        found = load_yolo(data_yaml, groups_file, person_class=self.person_class, listed_groups=self.groups,
                          partition_column=self.partition_column if self.partition == "column" else None,
                          box_tolerance=self.box_tolerance)
        if len(found.group_names) < 2:
            raise ConfigError(f"dataset.groups_file: {groups_file} gives {len(found.group_names)} group(s); fairness "
                              "needs at least two")
        if self.protected_group is not None and self.protected_group >= len(found.group_names):
            raise ConfigError(f"dataset.protected_group: {self.protected_group}, but {groups_file} has groups "
                              + ", ".join(f"{i}={g}" for i, g in enumerate(found.group_names)))
        n = len(found.image_paths)
        annotations = Annotations(found.image_index, np.zeros(len(found.image_index), np.int64), found.boxes,
                                  found.groups, np.full(len(found.image_index), -1, np.int64))
        source = LoaderImages(num_images=n, loader=ImageFiles(found.image_paths, found.image_sizes),
                              annotations=annotations)
        pool = np.flatnonzero(found.image_split == "train")
        held = "test" if (found.image_split == "test").any() else "val"
        test = np.flatnonzero(found.image_split == held)
        if test.size == 0:
            raise ConfigError(f"dataset.data: {data_yaml} has no val or test images for the test split")
        splits = federated_splits(image_groups(found.image_index, found.groups, n), self, seed, pool=pool, test=test,
                                  client_labels=found.client_labels)
        data = FederatedDetectionData(source=source, splits=splits, num_groups=len(found.group_names), num_classes=1,
                                      batch_size=self.batch_size, image_size=self.image_size, augment=self.augment,
                                      loader=self.loader)
        check_client_count(self, data)
        return data
