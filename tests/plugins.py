"""Tests-only plug-ins, registered purely through config (tests/plugin_conf/): no library file names them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.config.fields import setting
from resfl_lightning.data.datasets.base import FederatedDataset
from resfl_lightning.data.tabular import federated_tabular_data
from resfl_lightning.types import ClientReport


@dataclass
class DropLargestMean(GatherAllRule):
    """Mean of the round's updates without the one of largest l2 norm (all of them when there is only one)."""

    keep_at_least: int = 1

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        if deltas.shape[0] <= self.keep_at_least:
            return deltas.to(torch.float64).mean(dim=0)
        largest = int(deltas.to(torch.float64).norm(dim=1).argmax())
        keep = [i for i in range(deltas.shape[0]) if i != largest]
        return deltas[keep].to(torch.float64).mean(dim=0)


@dataclass(kw_only=True)
class GaussianRows(FederatedDataset):
    """Random tabular rows whose label depends on one feature and the group: a dataset that exists only here."""

    task: str = setting("classification", "rows -> binary label", choices=("classification",))
    num_features: int = setting(6, "feature width", ge=1)
    num_groups: int = setting(2, "sensitive groups", ge=2)
    rows_per_client: int = setting(40, "training rows per client", ge=1)
    test_rows: int = setting(60, "rows in the test split", ge=1)

    def build(self, seed: int):
        rng = np.random.default_rng(seed)
        n = self.num_clients * self.rows_per_client
        x = rng.normal(size=(n + self.test_rows, self.num_features)).astype(np.float32)
        s = rng.integers(0, self.num_groups, size=n + self.test_rows)
        y = ((x[:, 0] + 0.5 * s) > 0.2).astype(np.int64)
        return federated_tabular_data(
            x[:n], y[:n], s[:n], x[n:], y[n:], s[n:], num_groups=self.num_groups, seed=seed,
            num_clients=self.num_clients, reserve_fraction=self.reserve_fraction, val_fraction=self.val_fraction,
            batch_size=self.batch_size, partition=self.partition, dirichlet_alpha=self.dirichlet_alpha,
            loader=self.loader)
