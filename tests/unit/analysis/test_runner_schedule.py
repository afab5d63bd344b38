"""The table runner's scheduling (analysis/runner.py): a free worker takes the longest waiting run it can predict,
unknown kinds before known ones, so a table does not end on one long DP run while the other worker idles."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from resfl_lightning.analysis import runner


def finish(rd: Path, wall: float) -> None:
    rd.mkdir(parents=True, exist_ok=True)
    (rd / "summary.json").write_text("{}")
    (rd / "table_wall_s.json").write_text(json.dumps({"wall_s": wall}))


def test_job_kind_drops_only_the_seed():
    assert runner.job_kind(Path("o/fedavg_dp-s3")) == "fedavg_dp"
    assert runner.job_kind(Path("o/fedavg_dp-s12-byzantine")) == "fedavg_dp-byzantine"
    assert runner.job_kind(Path("o/puffle-t2-s121")) == "puffle-t2"
    assert runner.job_kind(Path("o/resfl-lp0.3-strong-s104")) == "resfl-lp0.3-strong"


def test_finished_first_then_unknown_kinds_in_order_then_longest_known_first(tmp_path: Path):
    finish(tmp_path / "fedavg-s0", 10.0)
    finish(tmp_path / "fedavg_dp-s0", 90.0)
    finish(tmp_path / "resfl-s0", 20.0)
    finish(tmp_path / "resfl-s1", 40.0)  # resfl's mean: 30
    names = ["fedavg-s0", "fedavg-s1", "resfl-s0", "resfl-s1", "resfl-s2", "fedavg_dp-s0", "fedavg_dp-s1",
             "curvfed-s0", "fairfed-s1"]
    jobs = [(tmp_path / n, [n]) for n in names]
    order = [rd.name for rd, _ in runner.scheduled(jobs)]
    assert order == ["fedavg-s0", "resfl-s0", "resfl-s1", "fedavg_dp-s0",  # finished: report at once
                     "curvfed-s0", "fairfed-s1",  # no finished run of their kind: as given
                     "fedavg_dp-s1", "resfl-s2", "fedavg-s1"]  # 90 s, 30 s, 10 s


def test_the_time_left_is_the_waiting_runs_kind_means_over_the_workers(tmp_path: Path):
    left = [tmp_path / n for n in ("a-s2", "b-s1", "c-s0")]
    assert runner.remaining_seconds(left, {}, 2) is None  # nothing finished: no estimate
    finished = {tmp_path / "a-s0": 100.0, tmp_path / "a-s1": 200.0, tmp_path / "b-s0": 50.0}
    # a-s2: a's mean 150; b-s1: 50; c-s0 (kind not seen): the mean of every finished run, 350 / 3
    assert runner.remaining_seconds(left, finished, 2) == (150.0 + 50.0 + 350.0 / 3) / 2
    assert runner.remaining_seconds(left[2:], finished, 4) == 350.0 / 3  # one left: one worker's time


def test_progress_lines_carry_the_time_left_from_the_runs_finished_so_far(tmp_path: Path, monkeypatch):
    """The estimate uses the walls run_one returned (no re-read of the run folders); a failed run is not left."""
    walls = {"a-s0": 100.0, "a-s1": 300.0, "a-s2": 200.0}

    def fake_run_one(overrides, rd):
        if rd.name.startswith("bad"):
            raise ValueError("broken")
        return walls[rd.name]

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    lines: list[str] = []
    names = ["a-s0", "a-s1", "bad-s0", "a-s2"]
    runner.run_jobs([(tmp_path / n, []) for n in names], 1, lines.append)
    assert lines[-1].startswith("[4/4]") and "min left" not in lines[-1]
    assert any(line.startswith("[3/4]") and "about 3 min left" in line for line in lines)  # a-s2 at a's mean 200 s


def test_a_free_worker_takes_the_longest_run_known_when_it_asks(tmp_path: Path, monkeypatch):
    # Two workers. Once short-s0 finished, "short" is a known short kind while "dp" is not known yet (dp-s0 still
    # runs): dp-s1 must start before the remaining short runs although it is listed last (in the given order it would
    # start last and run alone at the end).
    walls = {"short": 0.01, "dp": 0.2}
    started: list[str] = []
    lock = threading.Lock()

    def fake_run_one(overrides, rd):
        with lock:
            started.append(rd.name)
        wall = walls[rd.name.split("-")[0]]
        time.sleep(wall)
        finish(rd, wall)
        return wall

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    names = ["dp-s0", "short-s0"] + [f"short-s{i}" for i in range(1, 5)] + ["dp-s1"]
    lines: list[str] = []
    failures = runner.run_jobs([(tmp_path / n, []) for n in names], 2, lines.append)
    assert failures == [] and len(lines) == len(names)
    assert started.index("dp-s1") < started.index("short-s2")
    assert sorted(started) == sorted(names)


def test_a_failed_run_is_reported_and_the_others_still_run(tmp_path: Path, monkeypatch):
    def fake_run_one(overrides, rd):
        if rd.name == "bad-s0":
            raise RuntimeError(f"run {rd} failed (1)")
        finish(rd, 0.0)
        return 0.0

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    lines: list[str] = []
    failures = runner.run_jobs([(tmp_path / n, []) for n in ("bad-s0", "ok-s0", "ok-s1")], 2, lines.append)
    assert failures == [f"run {tmp_path / 'bad-s0'} failed (1)"]
    assert sum("FAILED" in line for line in lines) == 1 and len(lines) == 3


def test_a_timing_file_being_written_neither_stops_a_worker_nor_counts_as_finished(tmp_path: Path):
    # Seen in a 360-run tune: a worker's scheduler read another run's table_wall_s.json while it was being written
    # (empty), the JSON error killed that worker thread and the tune went on with one worker.
    finish(tmp_path / "fedavg-s0", 10.0)
    half = tmp_path / "fedavg-s1"
    finish(half, 12.0)
    (half / "table_wall_s.json").write_text("")  # mid-write
    assert not runner.is_finished(half) and runner.recorded_wall(half) is None
    order = [rd.name for rd, _ in runner.scheduled([(tmp_path / n, [n]) for n in ("fedavg-s1", "fedavg-s0")])]
    assert order == ["fedavg-s0", "fedavg-s1"]


def test_any_error_of_one_job_is_that_job_s_failure_and_every_worker_goes_on(tmp_path: Path, monkeypatch):
    ran: list[str] = []

    def fake_run_one(overrides, rd):
        if rd.name.startswith("bad"):
            raise ValueError("unreadable")
        ran.append(rd.name)
        finish(rd, 0.0)
        return 0.0

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    names = ["bad-s0", "bad-s1", *(f"ok-s{i}" for i in range(6))]
    failures = runner.run_jobs([(tmp_path / n, []) for n in names], 2, lambda line: None)
    assert failures == [f"run {tmp_path / n}: ValueError: unreadable" for n in ("bad-s0", "bad-s1")]
    assert sorted(ran) == sorted(n for n in names if n.startswith("ok"))


def test_the_timing_record_is_written_whole(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(runner, "_launch", lambda overrides, log: 0)
    rd = tmp_path / "fedavg-s0"
    rd.mkdir()
    (rd / "summary.json").write_text("{}")
    wall = runner.run_one(["seed=0"], rd)
    assert runner.recorded_wall(rd) == wall and [p.name for p in rd.iterdir() if p.name.endswith(".partial")] == []


def test_past_the_start_deadline_no_run_starts_and_the_ones_in_flight_finish(tmp_path: Path, monkeypatch):
    started: list[str] = []
    pause = [1.0]  # the first two runs outlast the deadline; the two workers take them well before it

    def fake_run_one(overrides, rd):
        if runner.is_finished(rd):  # as run_one: a finished run only reports
            return 0.0
        started.append(rd.name)
        time.sleep(pause[0])
        finish(rd, pause[0])
        return pause[0]

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    monkeypatch.setattr(runner, "_START_DEADLINE", None)  # restored after the test whatever happens
    runner.stop_starting_after(0.5 / 60)  # 0.5 s from now
    names = [f"a-s{i}" for i in range(5)]
    lines: list[str] = []
    with pytest.raises(runner.StoppedStarting, match="3 of 5 runs not started"):
        runner.run_jobs([(tmp_path / n, []) for n in names], 2, lines.append)
    assert sorted(started) == ["a-s0", "a-s1"] and len(lines) == 2  # both in flight at the deadline finished
    assert all(runner.is_finished(tmp_path / n) for n in started)
    runner.stop_starting_after(None)
    pause[0] = 0.0
    assert runner.run_jobs([(tmp_path / n, []) for n in names], 2, lines.append) == []  # no deadline: the rest run
    assert sorted(started) == sorted(names)


def test_finished_runs_are_no_runs_to_start_past_the_deadline(tmp_path: Path, monkeypatch):
    """A command re-rendering from finished (restored) runs under a deadline that has passed reports them all and
    raises nothing; an unfinished one still is not started."""
    started: list[str] = []

    def fake_run_one(overrides, rd):
        if runner.is_finished(rd):
            return 0.0
        started.append(rd.name)
        return 1.0

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    monkeypatch.setattr(runner, "_START_DEADLINE", None)
    names = [f"a-s{i}" for i in range(4)]
    for n in names[:3]:
        finish(tmp_path / n, 2.0)
    runner.stop_starting_after(0.001 / 60)
    time.sleep(0.01)
    lines: list[str] = []
    with pytest.raises(runner.StoppedStarting, match="1 of 4 runs not started"):
        runner.run_jobs([(tmp_path / n, []) for n in names], 2, lines.append)
    assert started == [] and len(lines) == 3
    assert runner.run_jobs([(tmp_path / n, []) for n in names[:3]], 2, lines.append) == []
    runner.stop_starting_after(None)


def test_a_start_deadline_must_be_positive():
    with pytest.raises(ValueError, match="stop-starting-after"):
        runner.stop_starting_after(0)


def test_a_stop_file_touched_while_runs_train_starts_no_more_and_is_removed(tmp_path: Path, monkeypatch):
    """`touch <out>/STOP` mid-command: the runs in flight finish, nothing else starts, the file is consumed so the
    same command then continues the rest."""
    stop = tmp_path / "STOP"
    started: list[str] = []

    def fake_run_one(overrides, rd):
        if runner.is_finished(rd):
            return 0.0
        started.append(rd.name)
        if len(started) == 2:
            stop.touch()  # the user, while the second run trains
        finish(rd, 0.0)
        return 0.0

    monkeypatch.setattr(runner, "run_one", fake_run_one)
    monkeypatch.setattr(runner, "_START_DEADLINE", None)
    jobs = [(tmp_path / f"a-s{i}", []) for i in range(5)]
    lines: list[str] = []
    with pytest.raises(runner.StoppedStarting, match=r"as .*STOP asked \(now removed\): 3 of 5 runs not started"):
        runner.run_jobs(jobs, 1, lines.append, stop_file=stop)
    assert started == ["a-s0", "a-s1"] and not stop.exists()
    assert lines[0] == f"to start no more runs (the runs in flight finish and are kept): touch {stop}"
    assert runner.run_jobs(jobs, 1, lines.append, stop_file=stop) == []  # the same command continues
    assert started == [f"a-s{i}" for i in range(5)]


def test_a_stop_file_never_touched_changes_nothing_and_finished_runs_print_no_hint(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(runner, "run_one", lambda overrides, rd: finish(rd, 0.0) or 0.0)
    monkeypatch.setattr(runner, "_START_DEADLINE", None)
    jobs = [(tmp_path / f"a-s{i}", []) for i in range(3)]
    lines: list[str] = []
    assert runner.run_jobs(jobs, 2, lines.append, stop_file=tmp_path / "STOP") == []
    assert all(runner.is_finished(rd) for rd, _ in jobs) and len(lines) == 4
    lines.clear()
    assert runner.run_jobs(jobs, 2, lines.append, stop_file=tmp_path / "STOP") == []
    assert not any(line.startswith("to start no more runs") for line in lines)
