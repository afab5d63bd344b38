"""analysis/run_resume.py through the launcher's run_one: an interrupted table run continues from its checkpoint
(resume=true) only when it is of an earlier round and the saved config is what the command composes now, and its
recorded wall time adds the earlier attempts' work up to their last checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from resfl_lightning.analysis import run_resume, runner
from resfl_lightning.analysis.run_settings import composed_settings, finished_run_mismatch


@pytest.fixture
def launched(monkeypatch) -> list[list[str]]:
    """The overrides each launch got; a launch writes the summary as a finished run does, in ~0 s."""
    calls: list[list[str]] = []

    def fake_launch(overrides: list[str], log: Path) -> int:
        calls.append(list(overrides))
        (log.parent / "summary.json").write_text("{}")
        log.write_text("this attempt\n")
        return 0

    monkeypatch.setattr(runner, "_launch", fake_launch)
    return calls


def interrupted(run_dir: Path, round_idx: int, rounds: int, worked_s: float | None, prior_s: float = 0.0) -> None:
    """A run killed after checkpointing `round_idx` of `rounds`, `worked_s` after its attempt started."""
    (run_dir / "checkpoints").mkdir(parents=True)
    checkpoint = {"round_idx": round_idx, "theta": torch.zeros(3), "int_buffers": {}}
    torch.save(checkpoint, run_dir / "checkpoints" / "last.pt")
    OmegaConf.save(OmegaConf.create({"federation": {"rounds": rounds}}), run_dir / "config.yaml")
    (run_dir / "table_train.log").write_text("the killed attempt\n")
    if worked_s is not None:
        mtime = (run_dir / "checkpoints" / "last.pt").stat().st_mtime
        (run_dir / run_resume.ATTEMPT_FILE).write_text(json.dumps({"started": mtime - worked_s, "prior_s": prior_s,
                                                                   "attempt": 1}))


def test_an_interrupted_run_resumes_and_counts_the_work_before_its_checkpoint(tmp_path, launched, monkeypatch):
    monkeypatch.setattr("resfl_lightning.analysis.run_settings.finished_run_mismatch", lambda rd, o: [])
    rd = tmp_path / "fedavg-s0"
    interrupted(rd, round_idx=1, rounds=3, worked_s=100.0, prior_s=20.0)
    wall = runner.run_one(["seed=0"], rd)
    assert launched == [["seed=0", "resume=true"]]
    record = json.loads((rd / "table_wall_s.json").read_text())
    assert 120.0 <= wall < 125.0 and record["wall_s"] == wall  # 20 s before, 100 s to the checkpoint, ~0 s now
    assert record["resumed_after_round"] == 1 and record["attempts"] == 2
    assert record["command"][-1] == "seed=0"  # the command that reproduces the run: no resume flag in it
    assert (rd / "table_train.attempt1.log").read_text() == "the killed attempt\n"


@pytest.mark.parametrize(("round_idx", "mismatch"), [(2, []), (1, ["federation.rounds: 3 -> 4"]), (None, [])],
                         ids=["last_round_checkpoint", "other_settings", "no_checkpoint"])
def test_a_run_that_cannot_resume_starts_over(tmp_path, launched, monkeypatch, round_idx, mismatch):
    monkeypatch.setattr("resfl_lightning.analysis.run_settings.finished_run_mismatch", lambda rd, o: mismatch)
    rd = tmp_path / "fedavg-s0"
    if round_idx is None:
        rd.mkdir()
    else:
        interrupted(rd, round_idx=round_idx, rounds=3, worked_s=100.0)
    t0 = time.perf_counter()
    wall = runner.run_one(["seed=0"], rd)
    assert launched == [["seed=0"]] and wall <= time.perf_counter() - t0
    record = json.loads((rd / "table_wall_s.json").read_text())
    assert "resumed_after_round" not in record
    assert json.loads((rd / run_resume.ATTEMPT_FILE).read_text())["attempt"] == 1


def test_an_attempt_without_a_record_counts_no_earlier_time(tmp_path, launched, monkeypatch):
    monkeypatch.setattr("resfl_lightning.analysis.run_settings.finished_run_mismatch", lambda rd, o: [])
    rd = tmp_path / "fedavg-s0"
    interrupted(rd, round_idx=0, rounds=2, worked_s=None)
    wall = runner.run_one(["seed=0"], rd)
    assert launched == [["seed=0", "resume=true"]] and wall < 5.0


def test_a_resumed_run_saved_with_resume_true_is_not_stale(tmp_path):
    """The resumed attempt saves resume: true in its config; it still matches the command without the flag."""
    overrides = ["dataset=adult", "logger=none", "federation.rounds=2"]
    saved = composed_settings(overrides)
    saved["resume"] = True
    OmegaConf.save(OmegaConf.create(saved), tmp_path / "config.yaml")
    assert finished_run_mismatch(tmp_path, overrides) == []
    saved["federation"]["rounds"] = 3
    OmegaConf.save(OmegaConf.create(saved), tmp_path / "config.yaml")
    assert finished_run_mismatch(tmp_path, overrides) == ["federation.rounds: 3 -> 2"]
