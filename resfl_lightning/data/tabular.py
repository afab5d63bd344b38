"""Federated views of a tabular classification dataset (e.g. UCI Adult, data/datasets/adult.py): client shards of the
training rows, the attack reserve, and the dataset's own test rows as the test split.

Rows live in one index space: the training file's rows first (0..n_train-1), then the test file's rows, so every
split (and every `index` an attack sees) is a plain row index into the same arrays.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from resfl_lightning.data.federated import ClientSplitLoaders, LoaderSettings
from resfl_lightning.data.partition import FederatedSplits, make_federated_splits

IN_PROCESS = LoaderSettings()  # no DataLoader workers


class TabularRows(Dataset):
    """Rows of (x, y, group) tensors; fetched a whole batch at a time (`__getitems__`), not row by row."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, groups: torch.Tensor, indices: np.ndarray) -> None:
        self.x, self.y, self.groups = x, y, groups
        self.indices = torch.as_tensor(np.asarray(indices, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.indices)

    def __getitems__(self, positions: list[int]) -> dict[str, torch.Tensor]:
        rows = self.indices[torch.as_tensor(positions, dtype=torch.long)]
        return {"x": self.x[rows], "y": self.y[rows], "groups": self.groups[rows], "index": rows}

    def __getitem__(self, position: int) -> dict[str, torch.Tensor]:
        batch = self.__getitems__([position])
        return {k: v[0] for k, v in batch.items()}


def _batch_collate(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """__getitems__ already returns the collated batch."""
    return batch


@dataclass
class FederatedTabularData(ClientSplitLoaders):
    """Features, labels and groups split into clients; only loaders leave this object, never raw group arrays."""

    x: torch.Tensor  # float32 (N, F)
    y: torch.Tensor  # int64 (N,)
    groups: torch.Tensor  # int64 (N,)
    splits: FederatedSplits
    num_groups: int
    batch_size: int
    eval_batch_size: int
    group_names: tuple[str, ...] = ()
    feature_names: tuple[str, ...] = ()
    num_classes: int = 2
    task: str = "classification"
    loader: LoaderSettings = LoaderSettings()

    def __post_init__(self) -> None:
        n = self.x.shape[0]
        if self.x.dim() != 2 or self.y.shape != (n,) or self.groups.shape != (n,):
            raise ValueError(f"tabular data: x {tuple(self.x.shape)}, y {tuple(self.y.shape)} and groups "
                             f"{tuple(self.groups.shape)} must describe the same rows")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise ValueError(f"batch sizes must be >= 1, got {self.batch_size} and {self.eval_batch_size}")
        for i, c in enumerate(self.splits.clients):
            if len(c.train) < 2:
                raise ValueError(f"client {i} has {len(c.train)} training rows; BatchNorm needs at least 2")

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    def _loader(self, indices: np.ndarray, shuffle: bool, seed: int = 0, train: bool = False,
                augment: bool = True) -> DataLoader:  # rows are never augmented
        ds = TabularRows(self.x, self.y, self.groups, indices)
        size = self.batch_size if train else self.eval_batch_size
        # A one-row final batch would break BatchNorm in train mode; drop it only then (no other row is ever lost).
        drop_last = train and len(ds) % size == 1
        gen = torch.Generator().manual_seed(seed) if shuffle else None
        return DataLoader(ds, batch_size=size, shuffle=shuffle, generator=gen, drop_last=drop_last,
                          collate_fn=_batch_collate, **self.loader.kwargs())

    def loader_for(self, indices: np.ndarray) -> DataLoader:
        indices = np.asarray(indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= self.x.shape[0]):
            raise ValueError(f"loader_for: row indices must lie in 0..{self.x.shape[0] - 1}")
        return self._loader(indices, shuffle=False)


def federated_tabular_data(x_train: np.ndarray, y_train: np.ndarray, s_train: np.ndarray, x_test: np.ndarray,
                           y_test: np.ndarray, s_test: np.ndarray, num_groups: int, seed: int, *, num_clients: int,
                           reserve_fraction: float, val_fraction: float, batch_size: int,
                           eval_batch_size: int | None = None, partition: str = "iid", dirichlet_alpha: float = 0.5,
                           dirichlet_centre: str = "uniform", loader: LoaderSettings = IN_PROCESS,
                           group_names: tuple[str, ...] = (), feature_names: tuple[str, ...] = (),
                           client_labels: np.ndarray | None = None, small_clients: str = "warn"
                           ) -> FederatedTabularData:
    """Client shards + reserve from the training rows (stratified by group, make_federated_splits); the test rows
    form the test split. eval_batch_size None: batch_size. partition="column": one client per value of
    client_labels (one per training row)."""
    n_train = len(y_train)
    part = make_federated_splits(s_train, num_clients=num_clients, test_fraction=0.0,
                                 reserve_fraction=reserve_fraction, val_fraction=val_fraction, partition=partition,
                                 alpha=dirichlet_alpha, seed=seed, dirichlet_centre=dirichlet_centre,
                                 client_labels=client_labels, small_clients=small_clients)
    splits = dataclasses.replace(part, test=np.arange(n_train, n_train + len(y_test), dtype=np.int64))
    return FederatedTabularData(
        x=torch.from_numpy(np.concatenate([x_train, x_test]).astype(np.float32)),
        y=torch.from_numpy(np.concatenate([y_train, y_test]).astype(np.int64)),
        groups=torch.from_numpy(np.concatenate([s_train, s_test]).astype(np.int64)),
        splits=splits, num_groups=num_groups, batch_size=batch_size,
        eval_batch_size=batch_size if eval_batch_size is None else eval_batch_size, group_names=tuple(group_names),
        feature_names=tuple(feature_names), loader=loader)
