"""Federated views of a dataset: per-client train/val loaders, the test split and the attack reserve."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from resfl_lightning.config.sections import LoaderSettings
from resfl_lightning.data.augment import DetectionAugment
from resfl_lightning.data.detection import AnnotatedImages, DetectionDataset, detection_collate
from resfl_lightning.data.partition import FederatedSplits, image_groups, make_federated_splits


def base_data(data: Any) -> Any:
    """The federated data under any attack wrapper (PoisonedData exposes the wrapped data as .base)."""
    while getattr(data, "is_attack_wrapper", False):
        data = data.base
    return data


class ClientSplitLoaders:
    """Loader accessors every federated dataset shares; a subclass builds the DataLoader in `_loader`."""

    splits: FederatedSplits

    def _loader(self, indices: np.ndarray, shuffle: bool, seed: int = 0, train: bool = False,
                augment: bool = True) -> DataLoader:
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

    def validation_loader(self) -> DataLoader:
        """Every client's validation split, in client order: the global model's final validation pass."""
        return self._loader(np.concatenate([c.val for c in self.splits.clients]).astype(np.int64), shuffle=False)

    def recalibration_loader(self, client_id: int) -> DataLoader:
        """The client's training split in order, in training-size batches, without augmentation (the SWA model's
        BatchNorm pass, federation/swa.py)."""
        return self._loader(self.splits.clients[client_id].train, shuffle=False, train=True, augment=False)

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

    def _loader(self, indices: np.ndarray, shuffle: bool, seed: int = 0, train: bool = False,
                augment: bool = True) -> DataLoader:
        augment = DetectionAugment() if train and augment and self.augment else None
        ds = DetectionDataset(self.source, indices, augment=augment, image_size=self.image_size, seed=seed)
        gen = torch.Generator().manual_seed(seed) if shuffle else None
        return DataLoader(ds, batch_size=self.batch_size, shuffle=shuffle, generator=gen,
                          collate_fn=detection_collate, **self.loader.kwargs())

    def loader_for(self, indices: np.ndarray) -> DataLoader:
        return self._loader(np.asarray(indices), shuffle=False)


def splits_for(source: AnnotatedImages, ds: Any, seed: int, num_items: int | None = None) -> FederatedSplits:
    """Client / test / reserve splits of the first `num_items` images (default: all), stratified by image group,
    with the dataset's fractions and partition (`ds`: a FederatedDataset)."""
    ann = source.annotations
    groups = image_groups(ann.image_index, ann.groups, len(source))[:num_items]
    return make_federated_splits(groups, num_clients=ds.num_clients, test_fraction=ds.test_fraction,
                                 reserve_fraction=ds.reserve_fraction, val_fraction=ds.val_fraction,
                                 partition=ds.partition, alpha=ds.dirichlet_alpha, seed=seed,
                                 dirichlet_centre=ds.dirichlet_centre, small_clients=ds.small_clients)


def instantiate_dataset(node: Any):
    """The FederatedDataset a `dataset` config node's `_target_` names, its keys checked (ConfigError naming the
    key); a FederatedDataset passes through."""
    from resfl_lightning.config.load import instantiate
    from resfl_lightning.data.datasets.base import FederatedDataset

    return node if isinstance(node, FederatedDataset) else instantiate(node, FederatedDataset, "dataset")


def build_federated_data(dataset: Any, seed: int, rank_zero: bool = True, printer=print,
                         device_type: str | None = None):
    """The federated data of `dataset` (a FederatedDataset or its config node) for the run seed, with the
    quality_skew scenario applied when configured. `device_type` (the run's torch.device.type) resolves
    dataset.loader.pin_memory=auto; None leaves it unresolved (nothing pinned)."""
    ds = instantiate_dataset(dataset)
    if device_type is not None:
        ds = replace(ds, loader=ds.loader.resolved(device_type))
    data = ds.build(seed)
    if ds.quality_skew is not None:  # scenario=quality_skew
        from resfl_lightning.data.quality_skew import apply_quality_skew

        data, summary = apply_quality_skew(data, ds.quality_skew, seed)
        if rank_zero:
            printer(f"scenario quality_skew: {summary}")
    if rank_zero:
        sizes = data.splits.sizes() if hasattr(data, "splits") else {}
        printer(f"dataset {ds.name}: " + ", ".join(f"{k}={v}" for k, v in sizes.items()
                                                     if not str(k).startswith("client")))
    return data
