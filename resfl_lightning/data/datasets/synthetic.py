"""`dataset=synthetic`: the built-in benchmark of generated street scenes (resfl_lightning/data/synthetic.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from resfl_lightning.config import rules
from resfl_lightning.config.fields import setting
from resfl_lightning.data.datasets.images import ImageDataset


@dataclass(kw_only=True)
class SyntheticDataset(ImageDataset):
    checks = (rules.dim_range_interval,)

    image_size: int = setting(128, "generated image side in pixels", ge=16)
    num_images: int = setting(720, "scenes shared by the clients, the test split and the reserve", ge=1)
    extra_reserve_images: int = setting(0, "extra scenes added to the attack reserve only", ge=0)
    data_seed: int = setting(0, "scene generator seed: a fixed benchmark, independent of the run seed", ge=0)
    imbalance: float = setting(2.0, "p(MST k) ~ exp(-imbalance (k-1)/9): darker tones rarer", ge=0)
    dark_dim_correlation: float = setting(1.0, "how strongly dark tones go with dim scenes and dark backdrops",
                                          ge=0, le=1)
    dim_probability: float = setting(0.3, "P(dim scene) without the correlation", ge=0, le=1)
    dark_background_probability: float = setting(0.6, "P(dark backdrop) without the correlation", ge=0, le=1)
    dim_range: list[float] = setting([0.12, 0.3], "brightness factor range of dim scenes [low, high]")
    dim_correlation: float | None = setting(None, "dark_dim_correlation for dim scenes alone (null: the same)",
                                            ge=0, le=1)
    background_correlation: float | None = setting(None, "dark_dim_correlation for dark backdrops alone (null: the "
                                                   "same)", ge=0, le=1)
    min_persons: int = setting(1, "fewest persons drawn in a scene", ge=0)
    max_persons: int = setting(4, "most persons drawn in a scene", ge=0)
    min_person_height: float = setting(0.15, "smallest person height, a fraction of the image side", gt=0, le=1.5)
    max_person_height: float = setting(0.6, "largest person height, a fraction of the image side", gt=0, le=1.5)
    short_sleeve_probability: float = setting(0.5, "P(bare forearms)", ge=0, le=1)
    shorts_probability: float = setting(0.25, "P(bare lower legs)", ge=0, le=1)
    sleeveless_probability: float | None = setting(None, "P(bare upper arms too), drawn only when set (null: "
                                                   "never)", ge=0, le=1)
    dark_clothing_probability: float | None = setting(None, "P(a person dresses in dark colours), independent of "
                                                      "tone (null: every clothing colour equally likely)", ge=0, le=1)
    cache_dir: str | None = setting(".cache/synthetic", "generated scenes are cached here (null: no cache)")

    def scene_config(self):
        """The generator's SyntheticSceneConfig for these settings."""
        from resfl_lightning.data.synthetic import SyntheticSceneConfig

        return SyntheticSceneConfig(
            image_size=self.image_size, imbalance=self.imbalance, grouping=self.grouping,
            dim_probability=self.dim_probability, dark_dim_correlation=self.dark_dim_correlation,
            dark_background_probability=self.dark_background_probability, dim_range=tuple(self.dim_range),
            dim_correlation=self.dim_correlation, background_correlation=self.background_correlation,
            min_persons=self.min_persons, max_persons=self.max_persons, min_person_height=self.min_person_height,
            max_person_height=self.max_person_height, short_sleeve_probability=self.short_sleeve_probability,
            shorts_probability=self.shorts_probability, dark_clothing_probability=self.dark_clothing_probability,
            sleeveless_probability=self.sleeveless_probability)

    def build(self, seed: int):
        from resfl_lightning.data.federated import FederatedDetectionData, splits_for
        from resfl_lightning.data.mst import num_groups
        from resfl_lightning.data.synthetic import generate_scenes

        scene_cfg = self.scene_config()
        extra = self.extra_reserve_images
        # The scenes are a fixed benchmark (data_seed); the run seed drives the partition and training. Scene i
        # depends only on (data_seed, i), so the extra reserve scenes leave the first num_images and hence every
        # split unchanged.
        scenes = generate_scenes(scene_cfg, self.num_images + extra, seed=self.data_seed, cache_dir=self.cache_dir)
        splits = splits_for(scenes, self, seed, num_items=self.num_images)
        if extra:  # more attack-probe data from the same distribution, without taking any from clients or test
            extra_ids = np.arange(self.num_images, self.num_images + extra, dtype=np.int64)
            splits = dataclasses.replace(splits, reserve=np.concatenate([splits.reserve, extra_ids]))
        return FederatedDetectionData(source=scenes, splits=splits, num_groups=num_groups(self.grouping),
                                      num_classes=1, batch_size=self.batch_size, image_size=None,
                                      augment=self.augment, loader=self.loader)
