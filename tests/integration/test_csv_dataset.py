"""dataset=csv end to end on a generated CSV with known group structure: the run's group TPRs and |1-DI| equal
fairlearn's on the final model's predictions over the test split."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from fairlearn.metrics import MetricFrame, demographic_parity_ratio, true_positive_rate

REPO = Path(__file__).resolve().parents[2]


def write_people(path: Path, n: int = 1200) -> None:
    """Three race groups with different base rates; the label depends on x and on the group."""
    rng = np.random.default_rng(7)
    race = rng.choice(["Asian", "Black", "White"], size=n, p=[0.2, 0.3, 0.5])
    x = rng.normal(size=n)
    shift = pd.Series(race).map({"Asian": 0.0, "Black": -0.6, "White": 0.6}).to_numpy()
    y = np.where(x + shift + rng.normal(scale=0.7, size=n) > 0, "yes", "no")
    pd.DataFrame({"x": x.round(4), "z": rng.normal(size=n).round(4), "job": rng.choice(["a", "b"], size=n),
                  "race": race, "approved": y}).to_csv(path, index=False)


@pytest.mark.slow
def test_csv_run_reports_fairlearns_group_tprs_and_di(tmp_path):
    from resfl_lightning.run_config.load import load_config
    from resfl_lightning.trained.load import build_trained_model, read_trained_config

    csv = tmp_path / "people.csv"
    write_people(csv)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "resfl_lightning.train", "dataset=csv", f"dataset.path={csv}",
           "dataset.target=approved", "dataset.positive=[yes]", "dataset.sensitive=race", "algorithm=fedavg",
           "federation.rounds=3", "dataset.batch_size=16", "logger=none", "progress=false",
           f"run_dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "offline", "YOLO_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((run_dir / "summary.json").read_text())

    torch.set_num_threads(1)
    cfg = load_config(read_trained_config(run_dir))
    data, client, _, _ = build_trained_model(cfg, run_dir / "checkpoints" / "last.pt")
    pred = client.test_outputs(data.test_loader())
    y, y_hat, s = pred.y.numpy(), pred.y_pred.numpy(), pred.groups.numpy()
    assert len(y) == 240 and set(np.unique(s)) == {0, 1, 2}  # 20% test split, groups Asian 0, Black 1, White 2
    frame = MetricFrame(metrics=true_positive_rate, y_true=y, y_pred=y_hat, sensitive_features=s)
    for g, tpr in frame.by_group.items():
        assert summary[f"test/tpr/{g}"] == pytest.approx(tpr, abs=1e-9)
    di = demographic_parity_ratio(y, y_hat, sensitive_features=s)
    assert summary["test/abs_one_minus_di"] == pytest.approx(1 - di, abs=1e-9)
    assert summary["test/accuracy"] == pytest.approx(float((y == y_hat).mean()), abs=1e-9)
    assert summary["test/accuracy"] > 0.7  # learnt something beyond the majority class


@pytest.mark.slow
def test_table_on_a_user_csv_from_command_line_keys_only(tmp_path):
    """The README's `resfl table --dataset csv ...` example: before attack.eod.protected_group=null took the smallest
    group, every method of this table failed at start (the privacy attacks' EOD needs a protected group)."""
    csv = tmp_path / "people.csv"
    write_people(csv, n=900)
    out = tmp_path / "table"
    cmd = [sys.executable, "-m", "resfl_lightning", "table", "--dataset", "csv", "--methods", "resfl,fairfed",
           "--seeds", "1", "--jobs", "1", "--out", str(out), f"dataset.path={csv}", "dataset.target=approved",
           "dataset.positive=[yes]", "dataset.sensitive=race", "federation.rounds=2"]
    env = {**os.environ, "WANDB_MODE": "offline", "YOLO_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    table = (out / "table.md").read_text()
    for method in ("fedavg", "resfl", "fairfed"):
        assert f"| {method} | 0." in table, table[:3000]
    summary = json.loads((out / "resfl-s0" / "summary.json").read_text())
    assert "test/eod" in summary and "attack/aia_balanced_accuracy" in summary
