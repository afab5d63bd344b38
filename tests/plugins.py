"""Tests-only plug-ins, registered purely through config (tests/plugin_conf/): no library file names them."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.algorithms.base import Algorithm
from resfl_lightning.clients.plugin import ClientPlugin, ServerPlugin, TermWeights
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


# A method: FedAvg's loss + w_logit x the batch's mean squared logit (tabular clients), with client-local state (the
# rounds a client trained), a report entry, and a server side that pools the round's steps and sends them back.
ROUNDS_KEY, STEPS_KEY, POOLED_KEY = "logit_penalty.rounds", "logit_penalty_steps", "logit_penalty.pooled_steps"


class LogitPenaltyTerm(ClientPlugin):
    def __init__(self, weight: float):
        self.weight, self.rounds, self.steps, self.received = weight, 0, 0, None

    def receive(self, client, sent) -> None:
        self.received = sent.get(POOLED_KEY)

    def begin_round(self, client) -> None:
        self.rounds, self.steps = self.rounds + 1, 0

    def loss_term(self, client, outputs, batch: dict) -> torch.Tensor:
        return outputs.logits.pow(2).mean()

    def weigh_term(self, term: torch.Tensor, task: torch.Tensor) -> TermWeights:
        return TermWeights(1.0, self.weight, {"logit_sq": term.detach()})

    def after_step(self, client) -> None:
        self.steps += 1

    def report(self, client, val_loader) -> dict[str, float]:
        return {STEPS_KEY: float(self.steps)}

    def export_state(self) -> dict[str, torch.Tensor]:
        return {ROUNDS_KEY: torch.tensor(self.rounds)}

    def import_state(self, state) -> None:
        self.rounds = int(state[ROUNDS_KEY]) if state is not None and ROUNDS_KEY in state else 0


class PooledSteps(ServerPlugin):
    def end_round(self, state, reports: list[ClientReport]):
        steps = sum(r.extras[STEPS_KEY] for r in reports)
        return replace(state, extra={**state.extra, POOLED_KEY: torch.tensor(steps, dtype=torch.float64)})


@dataclass(kw_only=True)
class LogitPenalty(Algorithm):
    """A method that exists only here: its keys, its client plug-in and its server plug-in."""

    w_logit: float = setting(0.01, "weight of the batch's mean squared logit", ge=0)

    def client_plugins(self, client, run) -> list:
        return [*super().client_plugins(client, run), LogitPenaltyTerm(self.w_logit)]

    def server_plugins(self) -> list:
        return [PooledSteps()]
