"""`dataset=facet`: FACET (Meta AI; layout in data/facet-format.md), IID or Dirichlet client shards by image MST
group, with a held-out test split and attack reserve (stratified)."""

from __future__ import annotations

from dataclasses import dataclass

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.fields import setting
from resfl_lightning.data.datasets.images import RecordsDataset
from resfl_lightning.data.facet import CLASS_MODES


@dataclass(kw_only=True)
class FacetDataset(RecordsDataset):
    classes: str = setting("person", "person: one class; class1: FACET's 52 person classes as object classes",
                           choices=CLASS_MODES)

    def preflight(self) -> None:
        """The annotations and at least one image folder present under dataset.root; shows the licence notice."""
        from resfl_lightning.data.facet import FACET_IMAGE_DIRS, facet_missing_message, resolve_facet_root
        from resfl_lightning.data.real_detection import show_facet_notice

        hint = "\nSet it with dataset.root=<folder>, e.g. make train DATASET=facet ARGS='dataset.root=/data/facet'."
        try:
            root = resolve_facet_root(self.root_path)
        except FileNotFoundError as err:
            raise ConfigError(f"dataset.root: {err}{hint}") from None
        if not any((root / d).is_dir() for d in FACET_IMAGE_DIRS):
            raise ConfigError(f"dataset.root: none of the image folders {', '.join(FACET_IMAGE_DIRS)} exists under "
                              f"{root}. {facet_missing_message(root)}{hint}")
        show_facet_notice(force=True)

    def build(self, seed: int):
        from resfl_lightning.data.facet import load_facet
        from resfl_lightning.data.real_detection import (
            federated_records,
            federated_splits,
            record_image_groups,
            report_skipped,
            show_facet_notice,
        )

        show_facet_notice(force=False)
        records = load_facet(self.root_path, classes=self.classes, grouping=self.grouping, on_error=self.on_error,
                             box_tolerance=self.box_tolerance, verify_images=self.verify_images)
        report_skipped("facet", records, "annotation rows")
        if records.num_images == 0:
            raise ValueError(f"FACET at {self.root_path}: no usable image (all rows were skipped or the CSV is empty)")
        return federated_records(records, federated_splits(record_image_groups(records), self, seed), self)
