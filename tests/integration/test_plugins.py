"""A user's own aggregation rule and dataset, registered purely through config: one module (tests/plugins.py) and
one yaml each (tests/plugin_conf/), found through hydra.searchpath; no library file names them."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers import compose_config
from tests.plugins import DropLargestMean, GaussianRows

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
    import pytest

    from resfl_lightning.builders import build_run
    from resfl_lightning.config import ConfigError

    cfg = compose_config(f"hydra.searchpath=[file://{PLUGIN_CONF}]", "dataset=gaussian_rows", "logger=none",
                         "dataset.num_groups=1", f"run_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=r"dataset\.num_groups"):
        build_run(cfg)
    assert not (tmp_path / "run").exists()
    assert GaussianRows.__module__ == "tests.plugins"
