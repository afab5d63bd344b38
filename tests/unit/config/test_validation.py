"""Bad config values are rejected before any work, with a message naming the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from resfl_lightning.config import ConfigError
from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config

REPO = Path(__file__).resolve().parents[3]


def test_default_config_is_valid_and_resolves():
    cfg = compose_config()
    load_config(cfg)
    assert cfg.dataset.name == "synthetic"
    assert cfg.aggregation._target_ == "resfl_lightning.aggregation.ufm_softmax.UfmSoftmax"
    assert cfg.federation.rounds == cfg.dataset.recipe.rounds  # recipe interpolation
    assert "lp0.1-lf0.01-b2.0" in cfg.run_name
    paper = compose_config("experiment=paper")
    assert paper.federation.rounds == 100 and paper.optim.lr == 1e-3
    assert list(paper.federation.lr_milestones) == [50, 75]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.beta=-1", "algorithm.beta"),
        ("algorithm.lambda_priv=-0.1", "algorithm.lambda_priv"),
        ("algorithm.lambda_fair=-1", "algorithm.lambda_fair"),
        ("ufm.clip_low=6", "ufm.clip_low"),
        ("fabric.devices=5", "fabric.devices"),
        ("dataset._target_=resfl_lightning.data.datasets.imagenet.ImageNet", "dataset._target_"),
        ("ufm.ema_decay=1.5", "ufm.ema_decay"),
        ("federation.rounds=0", "federation.rounds"),
        ("dataset.extra_reserve_images=-3", "dataset.extra_reserve_images"),
        ("federation.max_skipped_rounds=-1", "federation.max_skipped_rounds"),
        ("federation.max_skipped_rounds=1.5", "federation.max_skipped_rounds"),
    ],
)
def test_bad_values_name_the_key(override: str, key: str):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(compose_config(override))


def test_entry_point_rejects_bad_value_before_work(tmp_path: Path):
    env = {**os.environ, "WANDB_MODE": "offline"}
    proc = subprocess.run([sys.executable, "-m", "resfl_lightning.train", "algorithm.beta=-2", "logger=none",
                           f"run_dir={tmp_path / 'run'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert "algorithm.beta" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_proxy_cohorts_on_tabular_data_stop_before_any_client_runs():
    with pytest.raises(ConfigError, match="ufm.cohorts: 'proxy' needs a proxy column"):
        load_config(compose_config("dataset=adult", "ufm.cohorts=proxy"))


@pytest.mark.parametrize("kind", ["adaptive_cap", "adaptive_report"])
def test_adaptive_attacks_on_resfl_robust_stop_before_the_data_are_built(kind: str):
    # Before the rule, the run built its data and clients and failed in on_fit_start (CI: README command sweep).
    with pytest.raises(ConfigError, match=f"attack.byzantine.kind: {kind} attacks resfl_robust's .* use "
                                          "algorithm=resfl_robust"):
        load_config(compose_config(f"attack=byzantine_{kind}"))
    load_config(compose_config(f"attack=byzantine_{kind}", "algorithm=resfl_robust"))
    load_config(compose_config(f"attack=[privacy,byzantine_{kind}]", "attack.enabled=[mia]"))  # not run: no limit
