"""PUFFLE with its missing-group fallback on real Adult (clients/parity_rates.py): the pooled counts are server state
and the count releases client state, so 2 processes match 1 and an interrupted, resumed run matches an uninterrupted
one; epsilon_stat is spent and reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_train_end_to_end import assert_same_states, final_states

REPO = Path(__file__).resolve().parents[2]


def train(run_dir: Path, root: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "resfl_lightning.train", "dataset=adult", f"dataset.root={root}", "algorithm=puffle",
           "algorithm.dp.epsilon_split=[0.8,0.1,0.1]", "federation.rounds=2", "logger=none", "progress=false",
           f"run_dir={run_dir}", *overrides]
    env = {**os.environ, "WANDB_MODE": "offline", "YOLO_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
def test_fallback_runs_agree_across_processes_and_resume(adult_dir: Path, tmp_path: Path):
    train(tmp_path / "one", adult_dir)
    one = final_states(tmp_path / "one")
    assert "extra/parity.global_counts" in one and one["extra/parity.global_counts"].shape == (5, 3)
    assert all(f"client_{i}/dp.stat_history" in one for i in range(4))
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["dp/stat_releases"] == 2 and summary["dp/epsilon_stat"] == pytest.approx(0.1, rel=1e-9)

    train(tmp_path / "two", adult_dir, "fabric.devices=2")
    assert_same_states(final_states(tmp_path / "two"), one, exact=False)

    crashed = train(tmp_path / "crashy", adult_dir, "debug.crash_after_round=0", check=False)
    assert crashed.returncode != 0 and "simulated crash after round 0" in crashed.stderr
    train(tmp_path / "crashy", adult_dir, "resume=true")
    assert_same_states(final_states(tmp_path / "crashy"), one, exact=True)
