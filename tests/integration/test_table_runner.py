"""The table's launcher (analysis/runner.py): a run forked from the preloaded server is the same run as a fresh
`python -m resfl_lightning.train`, and a failing run fails alone with its log."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor and array of a checkpoint (weights, buffers, RNG states), by its path in the nested dict."""
    flat = {}

    def walk(prefix, obj):
        if isinstance(obj, (torch.Tensor, np.ndarray)):
            flat[prefix] = torch.as_tensor(obj)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{prefix}/{i}", v)

    walk("", torch.load(path, map_location="cpu", weights_only=False))
    return flat


def test_forked_run_is_bitwise_the_subprocess_run_and_a_failure_stays_alone(tmp_path, monkeypatch, shared_data):
    from resfl_lightning.analysis import runner

    common = ["dataset=adult", f"dataset.root={shared_data / 'adult'}", "algorithm=fedavg", "federation.rounds=2",
              "logger=none", "progress=false", "attack=none"]
    jobs = [(tmp_path / "forked", [*common, f"run_dir={tmp_path / 'forked'}"]),
            (tmp_path / "bad", [*common, "federation.rounds=0", f"run_dir={tmp_path / 'bad'}"])]
    failures = runner.run_jobs(jobs, workers=2, report=lambda line: None)
    assert len(failures) == 1 and "bad" in failures[0] and "table_train.log" in failures[0]
    assert "federation.rounds" in (tmp_path / "bad" / "table_train.log").read_text()  # the child's stderr is kept
    assert json.loads((tmp_path / "forked" / "table_wall_s.json").read_text())["launch"] == "forkserver"

    monkeypatch.setenv(runner.LAUNCH_ENV, "subprocess")
    assert runner.run_jobs([(tmp_path / "spawned", [*common, f"run_dir={tmp_path / 'spawned'}"])], workers=1,
                           report=lambda line: None) == []
    forked = _tensors(tmp_path / "forked" / "checkpoints" / "last.pt")
    spawned = _tensors(tmp_path / "spawned" / "checkpoints" / "last.pt")
    assert forked.keys() == spawned.keys() and "/theta" in forked
    for key in forked:
        assert torch.equal(forked[key], spawned[key]), key


def test_a_killed_table_run_resumes_from_its_checkpoint_to_the_uninterrupted_result(tmp_path, shared_data):
    """A run killed after a checkpoint (as a stopped machine leaves it) is continued by the launcher with resume=true
    and ends bitwise where an uninterrupted run of the same command ends (analysis/run_resume.py)."""
    import os
    import signal
    import subprocess
    import time

    from resfl_lightning.analysis import run_resume, runner

    def command(rd: Path) -> list[str]:
        return ["dataset=adult", f"dataset.root={shared_data / 'adult'}", "algorithm=fedavg", "federation.rounds=8",
                "logger=none", "progress=false", "attack=none", "use_tuned=false", f"run_dir={rd}"]

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert runner.run_jobs([(whole, command(whole))], workers=1, report=lambda line: None) == []
    killed.mkdir()
    run_resume.start_attempt(killed, 0.0, 1)
    proc = subprocess.Popen(runner.train_command(command(killed)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 300
    while run_resume.checkpoint_round(killed) is None and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    after = run_resume.checkpoint_round(killed)
    assert after is not None and after < 7, "the run ended before it could be killed; nothing was resumed"
    assert runner.run_jobs([(killed, command(killed))], workers=1, report=lambda line: None) == []
    record = json.loads((killed / "table_wall_s.json").read_text())
    assert record["resumed_after_round"] == after and record["attempts"] == 2
    a, b = (_tensors(d / "checkpoints" / "last.pt") for d in (whole, killed))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
