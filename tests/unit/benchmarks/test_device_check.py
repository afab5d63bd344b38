"""The device check's plan (every defence of the detection subset under every attack, the liar where a defence
reads reports) and its pass rule (a dropped client or a skipped round fails a run that exited 0)."""

from __future__ import annotations

import json

from resfl_lightning.analysis.robustness_grid import CLEAN, Cell, load_grid, select
from resfl_lightning.benchmarks.device_check import planned_cells, read_outcome, run_overrides


def test_every_defence_meets_every_attack_and_report_readers_meet_the_liar():
    grid = select(load_grid(), "detection")
    cells = planned_cells(grid)
    assert {c.defence for c in cells} == set(grid["defences"])
    for defence in grid["defences"]:
        mine = [c for c in cells if c.defence == defence]
        assert sorted(c.attack for c in mine) == sorted([CLEAN, *grid["attacks"]])
        expected = "lie" if defence in grid["reads_reports"] else "honest"
        assert {c.report for c in mine if c.attack != CLEAN} == {expected}


def test_runs_are_on_the_named_fabric_for_the_asked_rounds(tmp_path):
    grid = select(load_grid(), "detection")
    overrides = run_overrides(grid, planned_cells(grid)[0], tmp_path, rounds=2)
    assert "fabric=gpu" in overrides and "federation.rounds=2" in overrides
    assert f"dataset.num_clients={grid['clients']}" in overrides


def _run(tmp_path, dropped: list[float], summary: dict):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"round": i, "round/dropped": d}) + "\n"
                                                    for i, d in enumerate(dropped)))
    (tmp_path / "summary.json").write_text(json.dumps(summary))


def test_a_run_that_exits_0_fails_when_a_client_was_dropped_or_a_round_skipped(tmp_path):
    cell = Cell("median", "alie", "honest", 0.2)
    _run(tmp_path, [0.0, 0.0], {"rounds_completed": 2, "test/map_50": 0.01})
    assert read_outcome(cell, tmp_path, 0, 1.0, "").passed(rounds=2)
    assert not read_outcome(cell, tmp_path, 0, 1.0, "round 1: skipped, theta_G unchanged: x").passed(rounds=2)
    assert not read_outcome(cell, tmp_path, 0, 1.0, "").passed(rounds=3)
    _run(tmp_path, [0.0, 1.0], {"rounds_completed": 2, "test/map_50": 0.01})
    assert not read_outcome(cell, tmp_path, 0, 1.0, "").passed(rounds=2)
    _run(tmp_path, [0.0, 0.0], {"rounds_completed": 2, "test/map_50": float("nan")})
    assert not read_outcome(cell, tmp_path, 0, 1.0, "").passed(rounds=2)
