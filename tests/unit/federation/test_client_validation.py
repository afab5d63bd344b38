"""federation.client_validation=when_used: clients skip their validation pass only where nothing reads it."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
import torch

from resfl_lightning.aggregation.fedavg import FedAvg
from resfl_lightning.aggregation.resfl_robust import RobustResfl
from resfl_lightning.aggregation.ufm_softmax import UfmSoftmax
from resfl_lightning.callbacks.reports import ClientReportLogger
from resfl_lightning.clients.base import AdversarySettings, LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.federation.orchestrator import Federation, FederationSettings
from resfl_lightning.types import ClientReport
from tests.federation_helpers import FEATURES, GROUPS, tiny_data

ROUNDS = 3


class CountingClient(TabularClient):
    """Records the round of every validation pass."""

    def __init__(self, calls: list[int]):
        super().__init__(FEATURES, GROUPS, LossWeights(), UfmSettings(gate=None), OptimSettings(lr=0.05),
                         hidden=(16,), adversary=AdversarySettings(hidden=8))
        self.calls = calls

    def evaluate(self, loader):
        self.calls.append(self.round_idx)
        return super().evaluate(loader)


class HonestReport:
    """An update transform with a `report` hook (the shape of a Byzantine report mode) that changes nothing."""

    def __call__(self, client_id, round_idx, delta):
        return delta

    def report(self, client_id, round_idx, honest, validate_sent, report_u):
        return honest, report_u(honest.ufm_raw, honest.utility)


class Watch:
    """Every client's report, and its stored UFM EMA after the round, by round."""

    def __init__(self):
        self.reports: dict[int, list[ClientReport]] = {}
        self.ema: dict[int, list[float]] = {}

    def on_client_end(self, federation, round_idx, report):
        self.reports.setdefault(round_idx, []).append(report)
        self.ema.setdefault(round_idx, []).append(float(federation.client_states.get(report.client_id)["ufm.ema"]))


def run(tmp_path: Path, mode: str, aggregator=None, transforms=(), callbacks=(), **settings):
    calls: list[int] = []
    watch = Watch()
    fabric = L.Fabric(accelerator="cpu", devices=1, callbacks=[watch, *callbacks])
    federation = Federation(fabric=fabric, client_factory=lambda: CountingClient(calls), data=tiny_data(2),
                            aggregator=aggregator or FedAvg(), update_transforms=list(transforms),
                            settings=FederationSettings(rounds=ROUNDS, run_dir=tmp_path / mode,
                                                        client_validation=mode, **settings))
    state = federation.fit()
    return state, calls, watch


def test_a_rule_without_evaluation_validates_in_the_final_round_only(tmp_path):
    _, calls, watch = run(tmp_path, "when_used")
    assert calls == [ROUNDS - 1] * 2  # two clients, final round
    for round_idx, reports in watch.reports.items():
        final = round_idx == ROUNDS - 1
        for r in reports:
            fields = (r.ufm_raw, r.ufm_ema, r.u, r.val_utility, r.val_utility50, r.eval_loss, r.val_delta_eop)
            assert all(math.isfinite(v) for v in (r.u, r.val_utility, r.eval_loss)) if final \
                else all(math.isnan(v) for v in fields) and not r.gated


@pytest.mark.parametrize(("mode", "aggregator", "transforms"), [
    ("every_round", FedAvg(), ()),
    ("when_used", UfmSoftmax(), ()),
    ("when_used", FedAvg(), (HonestReport(),)),
])
def test_something_reads_the_evaluation_so_every_round_validates(tmp_path, mode, aggregator, transforms):
    _, calls, _ = run(tmp_path, mode, aggregator, transforms)
    assert calls == [0, 0, 1, 1, 2, 2]


def test_best_epoch_selection_validates_every_round(tmp_path):
    _, calls, watch = run(tmp_path, "when_used", local_epochs=2, keep_best_epoch=True)
    assert len(calls) == 2 * 2 * ROUNDS  # every client's every local epoch
    assert all(math.isfinite(r.val_utility) and math.isfinite(r.u) for reports in watch.reports.values()
               for r in reports)


def test_rules_declare_whether_they_read_the_evaluation():
    assert not FedAvg().uses_client_evaluation and UfmSoftmax().uses_client_evaluation
    assert not RobustResfl(mode="server").uses_client_evaluation and RobustResfl(mode="checked").uses_client_evaluation


def test_skipping_the_validation_leaves_the_model_and_the_fisher_bitwise_unchanged(tmp_path):
    """FedAvg on a tiny tabular federation: the same theta and, with report_fim, the same per-round Fisher
    eigenvalue (its random start follows the validation loader's draw from the torch RNG)."""
    every, _, w_every = run(tmp_path, "every_round", report_fim=True)
    used, calls, w_used = run(tmp_path, "when_used", report_fim=True)
    assert calls == [ROUNDS - 1] * 2
    assert torch.equal(every.theta, used.theta)
    assert {k: torch.equal(v, used.int_buffers[k]) for k, v in every.int_buffers.items()} \
        == {k: True for k in every.int_buffers}
    fim = {m: [r.fim_eigenvalue for r_idx in range(ROUNDS) for r in w.reports[r_idx]] for m, w in
           (("every", w_every), ("used", w_used))}
    assert fim["every"] == fim["used"] and all(math.isfinite(v) for v in fim["every"])


class SkipRoundOne:
    """Lets the rule read the evaluation in every round but round 1 (an instance attribute over the ClassVar)."""

    def on_round_start(self, federation, round_idx):
        federation.aggregator.uses_client_evaluation = round_idx != 1


def test_a_skipped_round_leaves_the_ufm_ema_as_it_was(tmp_path):
    _, calls, watch = run(tmp_path, "when_used", callbacks=[SkipRoundOne()])
    assert calls == [0, 0, 2, 2]
    assert all(math.isfinite(v) for v in watch.ema[0]) and watch.ema[1] == watch.ema[0]
    assert all(math.isnan(r.ufm_ema) for r in watch.reports[1])
    assert all(math.isfinite(r.ufm_ema) for r in watch.reports[2])


def _report(cid: int, validated: bool) -> ClientReport:
    v = 0.5 if validated else math.nan
    return ClientReport(client_id=cid, num_samples=10, ufm_raw=v, ufm_ema=v, u=v, gated=False, val_utility=v,
                        val_utility50=v, eval_loss=v, val_delta_eop=v)


def test_report_logger_means_skip_clients_without_validation():
    metrics: dict = {}
    ClientReportLogger().on_round_end([_report(0, False), _report(1, False)], {0: 0.5, 1: 0.5}, metrics)
    for key in ("clients/mean_u", "clients/mean_val_utility", "clients/gated_fraction", "clients/insufficient_groups",
                "clients/mean_ufm_raw", "client/0/gated", "client/1/ufm_raw"):
        assert math.isnan(metrics[key]), key
    assert metrics["clients/max_weight"] == 0.5
    metrics = {}
    ClientReportLogger().on_round_end([_report(0, True), _report(1, True)], {0: 0.5, 1: 0.5}, metrics)
    assert metrics["clients/mean_u"] == 0.5 and metrics["clients/insufficient_groups"] == 0.0
    assert metrics["clients/gated_fraction"] == 0.0 and metrics["client/0/gated"] == 0.0
