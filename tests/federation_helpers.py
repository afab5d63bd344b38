"""A tiny in-process federation (TabularNet on random rows, one CPU process) for fault and participation tests."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np

from resfl_lightning.aggregation.fedavg import FedAvg
from resfl_lightning.clients.base import AdversarySettings, LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.data.tabular import federated_tabular_data
from resfl_lightning.federation.orchestrator import Federation, FederationSettings

FEATURES, GROUPS = 6, 2


def tiny_data(num_clients: int, rows_per_client: int = 24, seed: int = 0, reserve_fraction: float = 0.0,
              extra_rows: int = 40):
    rng = np.random.default_rng(seed)
    n = num_clients * rows_per_client + extra_rows
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    s = rng.integers(0, GROUPS, size=n)
    y = ((x[:, 0] + 0.5 * s + 0.3 * rng.normal(size=n)) > 0.2).astype(np.int64)
    xt = rng.normal(size=(40, FEATURES)).astype(np.float32)
    splits = {"num_clients": num_clients, "reserve_fraction": reserve_fraction,
              "val_fraction": 0.25, "partition": "iid", "dirichlet_alpha": 0.5, "batch_size": 8,
              "eval_batch_size": 64}
    return federated_tabular_data(x, y, s, xt, (xt[:, 0] > 0.2).astype(np.int64), rng.integers(0, GROUPS, 40),
                                  num_groups=GROUPS, **splits, seed=seed)


def client_factory():
    return TabularClient(FEATURES, GROUPS, LossWeights(), UfmSettings(gate=None), OptimSettings(lr=0.05),
                         hidden=(16,), adversary=AdversarySettings(hidden=8))


class Recorder:
    """Keeps every round's metrics and every aggregated client's delta and report."""

    def __init__(self):
        self.metrics: list[dict] = []
        self.deltas: dict[tuple[int, int], object] = {}
        self.reports: list = []
        self.thetas: list = []
        self.initial = None

    def on_fit_start(self, state):
        self.initial = state.theta.clone()

    def on_client_end(self, round_idx, report, delta):
        self.deltas[(round_idx, report.client_id)] = delta.clone()
        self.reports.append(report)

    def on_metrics(self, metrics, state):
        self.metrics.append(dict(metrics))
        self.thetas.append(state.theta.clone())


def run_federation(run_dir: Path, num_clients: int = 3, rounds: int = 1, data=None, aggregator=None,
                   factory=client_factory, **settings):
    recorder = Recorder()
    fabric = L.Fabric(accelerator="cpu", devices=1, callbacks=[recorder])
    federation = Federation(fabric=fabric, client_factory=factory, data=data or tiny_data(num_clients),
                            aggregator=aggregator or FedAvg(),
                            settings=FederationSettings(rounds=rounds, run_dir=Path(run_dir), **settings))
    state = federation.fit()
    return federation, state, recorder
