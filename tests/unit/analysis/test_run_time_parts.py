"""The results header's profile of its runs (analysis/run_time_parts.py) against a hand-computed case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resfl_lightning.analysis.provenance import provenance_lines
from resfl_lightning.analysis.run_time_parts import ORDER, run_time_parts, time_parts_line

# 4 rounds: 10 s of local training, 1 s validation, 0.5 s aggregation and 30 s of callbacks a round; the last
# round's callbacks ran the attacks (80 + 20 + 5 s); 200 s of wall time in all
SUMMARY = {"rounds_completed": 4, "mean_time/train": 10.0, "mean_time/validate": 1.0, "mean_time/aggregate": 0.5,
           "mean_time/callbacks": 30.0, "attack/mia_audit_time": 80.0, "attack/mia_time": 20.0,
           "attack/aia_time": 5.0}
EXPECTED = {"local training": 40.0, "client validation": 4.0, "aggregation": 2.0, "membership audit": 80.0,
            "membership attack": 20.0, "attribute inference": 5.0, "evaluation and other callbacks": 15.0,
            "outside the timed rounds": 34.0}


def _run(path: Path, summary: dict | None, wall: float | None) -> Path:
    path.mkdir(parents=True)
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    if wall is not None:
        (path / "table_wall_s.json").write_text(json.dumps({"wall_s": wall}))
    return path


def test_one_run_splits_its_wall_time_into_the_timed_parts_and_the_rest():
    parts = run_time_parts(SUMMARY, 200.0)
    assert parts == pytest.approx(EXPECTED)
    assert tuple(parts) == ORDER
    assert sum(parts.values()) == pytest.approx(200.0)


def test_a_run_without_round_timings_has_no_parts():
    assert run_time_parts({"rounds_completed": 0, "mean_time/train": 1.0}, 10.0) is None
    assert run_time_parts({"test/map_50": 0.5}, 10.0) is None


def test_the_line_sums_the_finished_timed_runs_only(tmp_path: Path):
    runs = [_run(tmp_path / "a", SUMMARY, 200.0),
            _run(tmp_path / "b", {**SUMMARY, "attack/mia_audit_time": 0.0, "mean_time/callbacks": 6.25}, 100.0),
            _run(tmp_path / "running", None, None),  # not finished
            _run(tmp_path / "old", {"rounds_completed": 4}, 50.0)]  # no timings
    # b: training 40, validation 4, aggregation 2, attacks 25 of callbacks 25, the rest 100 - 71 = 29
    line = time_parts_line(runs)
    assert line == ("- the runs' time by part (2 runs, their own timers): local training 80 s (27 %), client "
                    "validation 8 s (3 %), aggregation 4 s (1 %), membership audit 80 s (27 %), membership attack "
                    "40 s (13 %), attribute inference 10 s (3 %), evaluation and other callbacks 15 s (5 %), outside "
                    "the timed rounds 63 s (21 %)")
    assert time_parts_line(runs[2:]) is None


def test_the_results_header_carries_the_line_after_the_wall_time(tmp_path: Path):
    run = _run(tmp_path / "a", SUMMARY, 200.0)
    lines = provenance_lines("resfl table", 250.0, 200.0, [run])
    wall = next(i for i, line in enumerate(lines) if line.startswith("- wall time: "))
    assert lines[wall + 1].startswith("- the runs' time by part (1 run, their own timers): local training 40 s (20 %)")
