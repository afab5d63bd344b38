"""Keys shared by the image detection datasets (synthetic, FACET, CARLA): input size, augmentation, MST grouping;
and those of the two read from annotated files on disk (FACET, CARLA)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.fields import setting
from resfl_lightning.data.datasets.base import FederatedDataset
from resfl_lightning.data.mst import GROUPINGS, mst_group_names
from resfl_lightning.data.records import ON_ERROR

MODEL_STRIDE = 32  # YOLOv8's largest stride: a letterboxed side must be a multiple of it


@dataclass(kw_only=True)
class ImageDataset(FederatedDataset):
    task: str = setting("detection", "image detection of persons", choices=("detection",))
    image_size: int = setting(640, "square model input side in pixels", ge=16)
    augment: bool = setting(True, "flip 0.5, brightness/contrast +-20%, hue +-10% on client training batches")
    grouping: str = setting("mst10", "mst10: 10 Monk Skin Tone groups; mst3: light / medium / dark",
                            choices=GROUPINGS)
    protected_groups: dict[str, int] = setting({}, "per grouping, the group protected_group defaults to")

    def group_names(self, seed: int) -> tuple[str, ...]:
        """The MST grouping's names (data/mst.py): light, medium, dark or mst1..mst10."""
        return mst_group_names(self.grouping)


def letterbox_side(ds: ImageDataset) -> None:
    if ds.image_size % MODEL_STRIDE:
        raise ConfigError(f"dataset.image_size: must be a positive multiple of {MODEL_STRIDE} (images are "
                          f"letterboxed to image_size x image_size for YOLOv8), got {ds.image_size!r}")


@dataclass(kw_only=True)
class RecordsDataset(ImageDataset):
    """Images and person annotations read from disk (data/records.py), letterboxed to image_size."""

    checks = (letterbox_side,)

    root: str | None = setting(None, "the dataset folder (or its environment variable)")
    on_error: str = setting("raise", "a bad annotation row: raise at the first, or skip it and count",
                            choices=ON_ERROR)
    box_tolerance: float = setting(0.02, "boxes past the border by <= this fraction of the side are clipped", ge=0)
    verify_images: bool = setting(False, "decode every image while indexing (slow) to catch truncated files")

    @property
    def root_path(self) -> Path | None:
        return None if self.root is None or str(self.root).strip() == "" else Path(str(self.root)).expanduser()
