"""The real entry point (`python -m resfl_lightning.train dataset=facet|carla`) on fixture folders, as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resfl_lightning.data.facet import FACET_DOWNLOAD_URL, FACET_LICENCE_NOTICE
from tests.fixtures_real import write_carla_fixture, write_facet_fixture

REPO = Path(__file__).resolve().parents[2]
SMOKE = ["dataset.image_size=128", "model.scale=femto", "logger=none", "progress=false", "federation.rounds=2",
         "eval.every=1", "dataset.num_clients=2"]


def _train(args: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FACET_ROOT", "CARLA_ROOT")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", YOLO_OFFLINE="1", WANDB_MODE="offline")
    return subprocess.run([sys.executable, "-m", "resfl_lightning.train", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _check_run(proc: subprocess.CompletedProcess, run_dir: Path) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["round"] for r in rows] == [0, 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 2
    assert "test/map" in summary and "test/delta_eop" in summary
    assert 0.0 <= summary["test/map"] <= 1.0


@pytest.mark.slow
def test_train_on_facet_fixture(tmp_path: Path):
    fx = write_facet_fixture(tmp_path / "facet", n_images=40)
    run_dir = tmp_path / "run"
    proc = _train(["dataset=facet", f"dataset.root={fx.root}", *SMOKE, f"run_dir={run_dir}"])
    _check_run(proc, run_dir)
    output = proc.stdout + proc.stderr
    assert output.count(FACET_LICENCE_NOTICE) == 1  # shown once, when the run starts
    assert "dataset facet: test=8, reserve=2, num_clients=2" in output


@pytest.mark.slow
def test_train_on_carla_fixture(tmp_path: Path):
    fx = write_carla_fixture(tmp_path / "carla")
    run_dir = tmp_path / "run"
    proc = _train(["dataset=carla", f"dataset.root={fx.root}", *SMOKE, f"run_dir={run_dir}"])
    _check_run(proc, run_dir)
    output = proc.stdout + proc.stderr
    assert "test=['eval'](13 frames)" in output and "reserve=['attack'](4 frames)" in output
    assert FACET_LICENCE_NOTICE not in output


def test_facet_without_root_explains_download_and_does_not_train(tmp_path: Path):
    run_dir = tmp_path / "run"
    proc = _train(["dataset=facet", "logger=none", "progress=false", f"run_dir={run_dir}"], timeout=120)
    assert proc.returncode != 0
    assert "dataset.root" in proc.stderr and FACET_DOWNLOAD_URL in proc.stderr
    assert "annotations/annotations.csv" in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()
    assert "dataset facet:" not in proc.stdout  # never got as far as loading data
