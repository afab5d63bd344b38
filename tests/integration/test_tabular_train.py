"""End to end on the real UCI Adult files: the Hydra entry point trains FedAvg and RESFL and writes the test metrics."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAJORITY_RATE = 11360 / 15060  # adult.test rows (complete) with income <= 50K: predicting "<=50K" always


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedavg", "resfl"])
def test_train_entry_point_on_adult(algorithm, shared_data, tmp_path):
    root = shared_data / "adult"
    if not (root / "adult.data").is_file():
        pytest.skip(f"Adult files not found under {root}")
    run_dir = tmp_path / algorithm
    cmd = [sys.executable, "-m", "resfl_lightning.train", "dataset=adult", f"dataset.root={root}",
           f"algorithm={algorithm}", "logger=none", "progress=false", "federation.rounds=2",
           "eval.every=1", f"run_dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "offline", "YOLO_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    tuned = f"conf/tuned/adult/{algorithm}.yaml"  # the method's shipped Adult setting, if any
    saved = (run_dir / "config.yaml").read_text()
    if (REPO / tuned).is_file():
        assert f"tuned: {tuned} applied" in proc.stdout and f"tuned_file: {tuned}" in saved
    else:
        assert "tuned: " not in proc.stdout and "tuned_file: null" in saved
    for key in ("test/accuracy", "test/abs_one_minus_di", "test/delta_eop", "test/eo_gap", "test/ufm"):
        assert key in summary and summary[key] is not None and math.isfinite(summary[key]), key
    assert summary["test/accuracy"] > MAJORITY_RATE + 0.04  # clearly better than the constant classifier
    assert 0 <= summary["test/delta_eop"] <= 1 and summary["test/abs_one_minus_di"] >= 0
    assert {f"test/tpr/{g}" for g in range(5)} <= set(summary)  # all five race groups measured

    rounds = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rounds[-1]
    assert all(math.isfinite(last[f"client/{i}/ufm_raw"]) for i in range(4))
    assert all(last[f"client/{i}/val_utility"] > MAJORITY_RATE for i in range(4))
    if algorithm == "resfl":  # the adversary and the regulariser add to the task loss
        assert last["train/adv"] > 0 and last["train/unc"] > 0
        assert last["train/total"] > last["train/task"]
    else:  # task loss only (the adversary is not even evaluated)
        assert last["train/adv"] == 0 and last["train/total"] == pytest.approx(last["train/task"], rel=1e-6)
