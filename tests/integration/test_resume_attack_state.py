"""A crash and resume keeps what the callbacks gathered over earlier rounds (ServerState.extra in the checkpoint): the
update-aware AIA attacks the same real and shadow rows, and the DP-SGD numbers over every client seen stay the same
under partial participation, as in the uninterrupted run (UCI Adult by sex, group_skew: clients of both dominant
groups, so the attack applies; FedAvg-DP, 2 of 4 clients a round)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_train_end_to_end import REPO, assert_same_states, final_states

pytestmark = pytest.mark.slow


def adult_run(run_dir: Path, root: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "resfl_lightning.train", "dataset=adult", f"dataset.root={root}",
           "scenario=group_skew", "dataset.sensitive=sex", "algorithm=fedavg_dp", "federation.rounds=3",
           "federation.clients_per_round=2", "logger=none", "progress=false", "attack=privacy",
           "attack.enabled=[update_aia]", "attack.update_aia.min_samples=2", "use_tuned=false", f"run_dir={run_dir}",
           *extra]
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def whole(adult_dir: Path, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume_state") / "whole"
    assert adult_run(run_dir, adult_dir).returncode == 0
    return run_dir


def update_aia_file(run_dir: Path) -> dict:
    return json.loads((run_dir / "attacks" / "update_aia_round_0002.json").read_text())


def assert_same_update_aia(a: dict, b: dict) -> None:
    for key in ("test_samples", "train_samples", "metrics"):
        assert json.dumps(a[key]) == json.dumps(b[key]), key  # NaN-safe: the same text


def test_resume_keeps_update_aia_rows_and_dp_numbers(whole: Path, adult_dir: Path, tmp_path: Path):
    crashed = tmp_path / "crashed"
    proc = adult_run(crashed, adult_dir, "debug.crash_after_round=1")
    assert proc.returncode != 0 and "simulated crash after round 1" in proc.stderr
    done = adult_run(crashed, adult_dir, "resume=true")
    assert done.returncode == 0, done.stderr[-4000:]
    assert_same_states(final_states(whole), final_states(crashed), exact=True)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, crashed))
    dp_keys = sorted(k for k in a if k.startswith("dp/"))
    assert dp_keys and {k: a[k] for k in dp_keys} == {k: b[k] for k in dp_keys}
    reference = update_aia_file(whole)
    assert reference["metrics"]["attack/update_aia_applicable"] == 1.0
    assert len(reference["test_samples"]) == 3 * 2  # every round's sampled clients, the resumed run's too
    assert len(reference["train_samples"]) > 0
    assert_same_update_aia(reference, update_aia_file(crashed))


def test_two_processes_gather_the_same_update_aia_rows(whole: Path, adult_dir: Path, tmp_path: Path):
    """The rows are gathered to rank 0 every round (to be checkpointed): two ranks attack the rows one rank does."""
    two = tmp_path / "two"
    proc = adult_run(two, adult_dir, "fabric.devices=2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert_same_update_aia(update_aia_file(whole), update_aia_file(two))
