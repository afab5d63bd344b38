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
