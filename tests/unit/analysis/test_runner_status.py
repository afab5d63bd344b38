"""analysis/runner.py: a run's exit status survives multiprocessing losing the forkserver's report of it (255)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from types import SimpleNamespace

import pytest

from resfl_lightning.analysis import runner


class LostStatus(multiprocessing.get_context("fork").Process):
    """A process whose status report is lost, as popen_forkserver returns it when reading the report fails."""

    @property
    def exitcode(self):
        return None if super().exitcode is None else runner.LOST_STATUS


@pytest.fixture
def lost_reports(monkeypatch):
    monkeypatch.setattr(runner, "_forkserver", lambda: SimpleNamespace(Process=LostStatus))
    monkeypatch.setattr(runner, "ENTRY_MODULE", "tests.unit.analysis.exit_with")


@pytest.mark.parametrize("code", [0, 3])
def test_the_childs_own_record_gives_the_status_when_the_report_is_lost(lost_reports, tmp_path: Path, code):
    log = tmp_path / "table_train.log"
    Path(runner.exit_file(str(log))).write_text("99")  # a stale record from an earlier launch is not read
    assert runner._launch([str(code)], log) == code


def test_a_child_that_died_before_recording_stays_failed(lost_reports, tmp_path: Path):
    log = tmp_path / "table_train.log"
    assert runner._launch(["hard0"], log) == runner.LOST_STATUS
