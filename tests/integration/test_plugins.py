"""A user's own aggregation rule, dataset and method, registered purely through config: one module (tests/plugins.py)
and one yaml each (tests/plugin_conf/), found through hydra.searchpath; no library file names them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import compose_config
from tests.plugins import POOLED_KEY, ROUNDS_KEY, STEPS_KEY, DropLargestMean, GaussianRows, LogitPenalty, PooledSteps

PLUGIN_CONF = Path(__file__).resolve().parents[1] / "plugin_conf"


class _Spy:
    def __init__(self):
        self.deltas, self.thetas = {}, []

    def on_fit_start(self, state):
        self.thetas.append(state.theta.clone())

    def on_client_end(self, round_idx, report, delta):
        self.deltas[(round_idx, report.client_id)] = delta.clone()

    def on_metrics(self, state):
        self.thetas.append(state.theta.clone())


def test_a_tests_only_rule_and_dataset_run_a_federation(tmp_path):
    from resfl_lightning.builders import build_run

    cfg = compose_config(f"hydra.searchpath=[file://{PLUGIN_CONF}]", "dataset=gaussian_rows",
                         "aggregation=drop_largest", "algorithm=fedavg", "logger=none", "progress=false",
                         "eval.every=1", "export.enabled=false", f"run_dir={tmp_path / 'run'}")
    job = build_run(cfg)
    fed = job.federation
    assert isinstance(fed.aggregator, DropLargestMean) and fed.data.num_clients == 3
    spy = _Spy()
    fed.fabric._callbacks.append(spy)
    state = job.fit()
    torch.set_num_threads(1)
    assert state.round_idx == 1
    for r in range(2):  # each round: theta_G + mean of the updates without the largest one
        stacked = torch.stack([spy.deltas[(r, c)] for c in range(3)]).double()
        keep = [i for i in range(3) if i != int(stacked.norm(dim=1).argmax())]
        expected = (spy.thetas[r].double() + stacked[keep].mean(dim=0)).float()
        torch.testing.assert_close(spy.thetas[r + 1], expected, rtol=0, atol=0)
    summary = (tmp_path / "run" / "summary.json").read_text()
    assert '"rounds_completed": 2' in summary


def test_the_plugin_dataset_keys_are_checked_like_any_other(tmp_path):
    from resfl_lightning.builders import build_run
    from resfl_lightning.config import ConfigError

    cfg = compose_config(f"hydra.searchpath=[file://{PLUGIN_CONF}]", "dataset=gaussian_rows", "logger=none",
                         "dataset.num_groups=1", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=r"dataset\.num_groups"):
        build_run(cfg)
    assert not (tmp_path / "run").exists()
    assert GaussianRows.__module__ == "tests.plugins"


def test_a_tests_only_method_runs_a_federation(tmp_path):
    """tests.plugins.LogitPenalty's plug-ins add its loss term, report entry, client-local state and the server's
    pooled value; the core names none of them."""
    from resfl_lightning.builders import build_run

    cfg = compose_config(f"hydra.searchpath=[file://{PLUGIN_CONF}]", "dataset=gaussian_rows", "algorithm=logit_penalty",
                         "federation.rounds=1", "logger=none", "progress=false", "export.enabled=false",
                         f"run_dir={tmp_path / 'run'}")
    job = build_run(cfg)
    fed = job.federation
    assert [type(p) for p in fed.server_plugins] == [PooledSteps]
    state = job.fit()
    torch.set_num_threads(1)
    assert state.round_idx == 0
    last = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    steps = [last[f"client/{c}/{STEPS_KEY}"] for c in range(3)]  # a scalar report entry is a per-client metric
    assert all(n > 0 for n in steps) and state.extra[POOLED_KEY].item() == sum(steps)
    method = fed.client_factory.algorithm
    assert isinstance(method, LogitPenalty) and method.w_logit == 0.05  # tests/plugin_conf/algorithm's value
    w = method.w_logit
    for c in range(3):  # FedAvg's other weights are 0: the step's loss is task + w x mean squared logit
        assert last[f"client/{c}/loss_total"] == pytest.approx(
            last[f"client/{c}/loss_task"] + w * last[f"client/{c}/loss_logit_sq"], rel=1e-6)
    assert all(int(fed.client_states.get(c)[ROUNDS_KEY]) == 1 for c in range(3))  # its client-local state
