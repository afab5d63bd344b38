"""End to end (slow): the training entry point with the weather evaluation on, then the fine-tuning command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resfl_lightning.data.weather import WEATHER_CONDITIONS

REPO = Path(__file__).resolve().parents[2]
TRAIN = ["logger=none", "progress=false", "model.scale=femto", "dataset.num_images=80", "federation.rounds=1",
         "++eval.weather=true"]  # ++: adds the key or overrides it once conf/train.yaml has eval.weather


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "YOLO_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("weather") / "run"
    _run(["resfl_lightning.train", *TRAIN, f"run_dir={run_dir}"])
    return run_dir


def _conditions(path: Path) -> list[tuple[str, int]]:
    payload = json.loads(path.read_text())
    return [(r["condition"], r["intensity"]) for r in payload["conditions"]]


@pytest.mark.slow
def test_train_with_weather_eval_writes_table_plot_and_metrics(trained_run: Path):
    assert _conditions(trained_run / "weather.json") == list(WEATHER_CONDITIONS)
    assert (trained_run / "weather.png").read_bytes()[:4] == b"\x89PNG"
    last = json.loads((trained_run / "metrics.jsonl").read_text().splitlines()[-1])
    for w, i in WEATHER_CONDITIONS:
        assert f"weather/{w}_{i}/map" in last
    # Clear is scored on the unmodified test split: the same mAP and loss as the regular test evaluation.
    rows = json.loads((trained_run / "weather.json").read_text())["conditions"]
    assert rows[0]["loss"] == pytest.approx(last["test/loss"], rel=1e-6)
    assert rows[0]["map"] == last["test/map"]


@pytest.mark.slow
def test_finetune_command_on_a_trained_run(trained_run: Path):
    _run(["resfl_lightning", "finetune", "--run-dir", str(trained_run), "--epochs", "1"])
    out = trained_run / "finetune"
    assert _conditions(out / "weather.json") == list(WEATHER_CONDITIONS)
    assert (out / "weather.png").is_file() and (out / "finetuned.pt").is_file()
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(epochs) == 1 and epochs[0]["steps"] > 0
    assert epochs[0]["lr/backbone"] == pytest.approx(0.1 * epochs[0]["lr/head"])
    summary = json.loads((out / "summary.json").read_text())
    run_summary = json.loads((trained_run / "summary.json").read_text())
    # The checkpoint was loaded: before fine-tuning the model scores exactly what the run's last evaluation did.
    assert summary["before/test/loss"] == pytest.approx(run_summary["test/loss"], rel=1e-6)
    assert summary["finetune_images"] > 0 and "weather/fog_100/map" in summary

    from resfl_lightning.federation.checkpoint import load_checkpoint

    tuned = load_checkpoint(out / "finetuned.pt", restore_rng=False)
    base = load_checkpoint(trained_run / "checkpoints" / "last.pt", restore_rng=False)
    assert tuned.theta.shape == base.theta.shape and not tuned.theta.equal(base.theta)


@pytest.mark.slow
def test_carla_run_and_finetune_use_recorded_conditions(tmp_path: Path):
    from tests.fixtures_real import write_carla_fixture

    fx = write_carla_fixture(tmp_path / "carla", n_finetune=24, n_eval=26, n_attack=4)
    run_dir = tmp_path / "run"
    _run(["resfl_lightning.train", *[a for a in TRAIN if not a.startswith("dataset.")], "dataset=carla",
          f"dataset.root={fx.root}", "dataset.image_size=96", "dataset.num_clients=2", "dataset.batch_size=8",
          "federation.local_epochs=1", "federation.lr_milestones=[50]", "optim.lr=0.001", f"run_dir={run_dir}"])
    for path in (run_dir / "weather.json", None):
        if path is None:
            _run(["resfl_lightning", "finetune", "--run-dir", str(run_dir), "--epochs", "1"])
            path = run_dir / "finetune" / "weather.json"
        payload = json.loads(path.read_text())
        assert payload["mode"] == "metadata" and [r["n_images"] for r in payload["conditions"]] == [2] * 13
    assert json.loads((run_dir / "finetune" / "summary.json").read_text())["finetune_images"] <= 24
