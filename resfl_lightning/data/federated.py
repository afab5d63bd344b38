"""Federated views of a dataset: per-client train/val loaders, the test split and the attack reserve."""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from resfl_lightning.data.augment import DetectionAugment
from resfl_lightning.data.detection import AnnotatedImages, DetectionDataset, detection_collate
from resfl_lightning.data.partition import FederatedSplits, image_groups, make_federated_splits


@dataclass(frozen=True)
class LoaderSettings:
    """dataset.loader: DataLoader worker processes, pinned host memory (fast, non-blocking copies to a GPU) and
    workers kept alive between epochs of one loader. Defaults keep everything in the training process."""

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None  # batches each worker prepares ahead (torch's default 2 when null)

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"dataset.loader.num_workers must be >= 0, got {self.num_workers}")
        if self.num_workers == 0 and (self.persistent_workers or self.prefetch_factor is not None):
            raise ValueError("dataset.loader.persistent_workers / prefetch_factor need num_workers > 0")

    @classmethod
    def from_config(cls, cfg) -> LoaderSettings:
        loader = (cfg.get("loader") if cfg is not None else None) or {}
        prefetch = loader.get("prefetch_factor")
        return cls(num_workers=int(loader.get("num_workers", 0)), pin_memory=bool(loader.get("pin_memory", False)),
                   persistent_workers=bool(loader.get("persistent_workers", False)),
                   prefetch_factor=None if prefetch is None else int(prefetch))

    def kwargs(self) -> dict:
        out = {"num_workers": self.num_workers, "pin_memory": self.pin_memory,
               "persistent_workers": self.persistent_workers}
        if self.prefetch_factor is not None:
            out["prefetch_factor"] = self.prefetch_factor
        return out


class ClientSplitLoaders:
    """Loader accessors every federated dataset shares; a subclass builds the DataLoader in `_loader`."""

    splits: FederatedSplits

    def _loader(self, indices: np.ndarray, shuffle: bool, seed: int = 0, train: bool = False) -> DataLoader:
        raise NotImplementedError

    @property
    def num_clients(self) -> int:
        return len(self.splits.clients)

    def num_train(self, client_id: int) -> int:
        return len(self.splits.clients[client_id].train)

    def train_loader(self, client_id: int, seed: int) -> DataLoader:
        return self.train_loader_for(self.splits.clients[client_id].train, seed)

    def train_loader_for(self, indices: np.ndarray, seed: int) -> DataLoader:
        """Shuffled, augmented training batches over any items (a client shard, a shadow model's set)."""
        return self._loader(np.asarray(indices, dtype=np.int64), shuffle=True, seed=seed, train=True)

    def val_loader(self, client_id: int) -> DataLoader:
        return self._loader(self.splits.clients[client_id].val, shuffle=False)

    def test_loader(self) -> DataLoader:
        return self._loader(self.splits.test, shuffle=False)

    def reserve_loader(self) -> DataLoader:
        return self._loader(self.splits.reserve, shuffle=False)


@dataclass
class FederatedDetectionData(ClientSplitLoaders):
    """Images + annotations split into clients; only loaders leave this object, never raw group arrays."""

    source: AnnotatedImages
    splits: FederatedSplits
    num_groups: int
    num_classes: int
    batch_size: int
    image_size: int | None
    augment: bool
    task: str = "detection"
    loader: LoaderSettings = LoaderSettings()

    def _loader(self, indices: np.ndarray, shuffle: bool, seed: int = 0, train: bool = False) -> DataLoader:
        augment = DetectionAugment() if train and self.augment else None
        ds = DetectionDataset(self.source, indices, augment=augment, image_size=self.image_size, seed=seed)
        gen = torch.Generator().manual_seed(seed) if shuffle else None
        return DataLoader(ds, batch_size=self.batch_size, shuffle=shuffle, generator=gen,
                          collate_fn=detection_collate, **self.loader.kwargs())

    def loader_for(self, indices: np.ndarray) -> DataLoader:
        return self._loader(np.asarray(indices), shuffle=False)


def _splits_for(source: AnnotatedImages, cfg: DictConfig, seed: int, num_items: int | None = None) -> FederatedSplits:
    """SPEC §8 splits over the first `num_items` images (default: all)."""
    ann = source.annotations
    groups = image_groups(ann.image_index, ann.groups, len(source))[:num_items]
    return make_federated_splits(groups, num_clients=cfg.num_clients, test_fraction=cfg.test_fraction,
                                 reserve_fraction=cfg.reserve_fraction, val_fraction=cfg.val_fraction,
                                 partition=cfg.partition, alpha=cfg.dirichlet_alpha, seed=seed,
                                 dirichlet_centre=cfg.get("dirichlet_centre", "uniform"))


def build_synthetic(cfg: DictConfig, seed: int) -> FederatedDetectionData:
    from resfl_lightning.data.mst import num_groups
    from resfl_lightning.data.synthetic import SyntheticSceneConfig, generate_scenes

    scene_cfg = SyntheticSceneConfig(image_size=cfg.image_size, imbalance=cfg.imbalance, grouping=cfg.grouping,
                                     dim_probability=cfg.dim_probability,
                                     dark_dim_correlation=cfg.dark_dim_correlation,
                                     dark_background_probability=cfg.dark_background_probability,
                                     dim_range=tuple(cfg.dim_range))
    extra = int(cfg.get("extra_reserve_images", 0))
    # The scenes are a fixed benchmark (data_seed); the run seed drives the partition and training. Scene i depends
    # only on (data_seed, i), so the extra reserve scenes leave the first num_images and hence every split unchanged.
    scenes = generate_scenes(scene_cfg, cfg.num_images + extra, seed=cfg.get("data_seed", 0), cache_dir=cfg.cache_dir)
    splits = _splits_for(scenes, cfg, seed, num_items=cfg.num_images)
    if extra:  # more attack-probe data from the same distribution, without taking any from the clients or the test
        extra_ids = np.arange(cfg.num_images, cfg.num_images + extra, dtype=np.int64)
        splits = dataclasses.replace(splits, reserve=np.concatenate([splits.reserve, extra_ids]))
    return FederatedDetectionData(source=scenes, splits=splits,
                                  num_groups=num_groups(cfg.grouping), num_classes=1, batch_size=cfg.batch_size,
                                  image_size=None, augment=cfg.augment, loader=LoaderSettings.from_config(cfg))


# dataset name -> module defining `build(cfg, seed)` and optionally `preflight(cfg)` (fast checks, e.g. files).
BUILDERS: dict[str, str] = {
    "synthetic": "resfl_lightning.data.federated",
    "facet": "resfl_lightning.data.real_detection",
    "carla": "resfl_lightning.data.real_detection",
    "adult": "resfl_lightning.data.tabular",
}


def _module_for(cfg: DictConfig):
    from resfl_lightning.config import ConfigError

    if cfg.name not in BUILDERS:
        raise ConfigError(f"dataset.name: no loader for {cfg.name!r}; available: {', '.join(sorted(BUILDERS))}")
    return importlib.import_module(BUILDERS[cfg.name])


def build(cfg: DictConfig, seed: int) -> FederatedDetectionData:
    """Entry for the built-in benchmark (other datasets define `build` in their own module)."""
    return build_synthetic(cfg, seed)


def dataset_preflight(cfg: DictConfig) -> None:
    """Cheap checks that must fail before any process starts (missing data, unknown name)."""
    module = _module_for(cfg)
    if hasattr(module, "preflight"):
        module.preflight(cfg)


def build_federated_data(cfg: DictConfig, seed: int, rank_zero: bool = True, printer=print):
    data = _module_for(cfg).build(cfg, seed)
    if cfg.get("quality_skew"):  # scenario=quality_skew
        from resfl_lightning.data.quality_skew import QualitySkewSettings, apply_quality_skew

        data, summary = apply_quality_skew(data, QualitySkewSettings(**cfg.quality_skew), seed)
        if rank_zero:
            printer(f"scenario quality_skew: {summary}")
    if rank_zero:
        sizes = data.splits.sizes() if hasattr(data, "splits") else {}
        printer(f"dataset {cfg.name}: " + ", ".join(f"{k}={v}" for k, v in sizes.items()
                                                      if not str(k).startswith("client")))
    return data
