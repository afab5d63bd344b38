"""The table's run launcher: each (method, seed, attack) run is `resfl train` in its own process, forked from a
server process that imported torch, Lightning, ultralytics and the package once (multiprocessing's forkserver with
preloaded modules), so a run starts training without re-importing them (~4-5 s a run on this project's 2-core
machine). Every run still gets a fresh process: nothing a run leaves behind (module state, RNG, caches) reaches the
next one, and a run that crashes, exits or is killed fails alone.

`RESFL_TABLE_LAUNCH=subprocess` falls back to one `python -m resfl_lightning.train` interpreter per run (the
command recorded beside every run either way)."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import runpy
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from resfl_lightning.analysis.run_records import finished_wall, is_finished, recorded_wall  # noqa: F401 (re-exported)

# What `resfl train` imports before its first step; the forkserver imports them once for all runs of a table.
PRELOAD = ("resfl_lightning.cli.train", "resfl_lightning.builders", "callbacks", "ultralytics.nn.tasks",
           "ultralytics.utils.loss", "opacus", "sklearn.linear_model", "scipy.stats")
LAUNCH_ENV = "RESFL_TABLE_LAUNCH"
ENTRY_MODULE = "resfl_lightning.train"  # run, not imported: the launcher executes the command as a user would
LOST_STATUS = 255  # popen_forkserver's returncode when the forkserver's report of the child's status is lost


def exit_file(log_path: str) -> str:
    """Where the forked child records its exit code (beside its log)."""
    return log_path + ".exit"


def train_command(overrides: list[str]) -> list[str]:
    """The equivalent command line of one run (what a user would type to repeat it; recorded beside the run)."""
    return [sys.executable, "-m", ENTRY_MODULE, *overrides]


def _train_child(overrides: list[str], log_path: str) -> None:
    """In the forked child: stdout and stderr into the run's log, then the entry module run as `__main__`, exactly
    as `python -m resfl_lightning.train <overrides>` runs it; the process's exit code is the run's (a Python
    exception: 1 with its traceback in the log)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    code = 0
    try:
        sys.argv = ["-m", *overrides]  # what `python -m resfl_lightning.train ...` sees; run_module sets argv[0]
        runpy.run_module(ENTRY_MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001  (anything a run raises is that run's failure, written to its log)
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    Path(exit_file(log_path)).write_text(str(code))  # the status a lost forkserver report cannot take away
    os._exit(code)  # skip interpreter teardown: the run's files are closed, and atexit hooks belong to the parent


_CONTEXT = None


def _forkserver():
    global _CONTEXT
    if _CONTEXT is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(list(PRELOAD))
        _CONTEXT = ctx
    return _CONTEXT


def _launch(overrides: list[str], log: Path) -> int:
    if os.environ.get(LAUNCH_ENV, "forkserver") == "subprocess":
        import subprocess

        with log.open("w") as fh:
            return subprocess.run(train_command(overrides), stdout=fh, stderr=subprocess.STDOUT, text=True).returncode
    status = Path(exit_file(str(log)))
    status.unlink(missing_ok=True)
    proc = _forkserver().Process(target=_train_child, args=(list(overrides), str(log)))
    proc.start()
    proc.join()
    if proc.exitcode == LOST_STATUS and status.is_file():
        # multiprocessing reports 255 when it could not read the child's status from the forkserver (it happened
        # once in a 360-run tune, to a run that had finished); the child's own record says what it returned
        return int(status.read_text())
    return int(proc.exitcode)


def run_one(overrides: list[str], run_dir: Path) -> float:
    """Train one run unless it already finished, continuing an unfinished one from its last checkpoint where it can
    (analysis/run_resume.py); returns its wall time (stored beside the run with its command)."""
    from resfl_lightning.analysis import run_resume

    timing = run_dir / "table_wall_s.json"
    if (done := finished_wall(run_dir)) is not None:
        return done
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "table_train.log"
    after = run_resume.resumable_round(run_dir, overrides)
    prior, attempts = run_resume.earlier_work(run_dir) if after is not None else (0.0, 0)
    if after is not None and log.is_file():
        log.replace(log.with_name(f"table_train.attempt{attempts}.log"))
    run_resume.start_attempt(run_dir, prior, attempts + 1)
    from resfl_lightning.analysis.checkout import git_commit

    commit = git_commit()  # the code the run trains with (a resumed run: the last attempt's)
    t0 = time.perf_counter()
    code = _launch([*overrides, "resume=true"] if after is not None else overrides, log)
    wall = prior + time.perf_counter() - t0
    if code != 0:
        raise RuntimeError(f"run {run_dir} failed ({code}); see {log}")
    record = {"wall_s": wall, "command": train_command(overrides), "launch": os.environ.get(LAUNCH_ENV, "forkserver"),
              "commit": commit}
    if after is not None:
        record.update(resumed_after_round=after, attempts=attempts + 1)
    # written whole, then renamed: the other workers' scheduler reads these files while runs finish
    partial = timing.with_name(timing.name + ".partial")
    partial.write_text(json.dumps(record))
    os.replace(partial, timing)
    return wall


def job_kind(run_dir: Path) -> str:
    """The run's name without its seed (`fedavg_dp-s3-byzantine` -> `fedavg_dp-byzantine`, `puffle-t2-s121` ->
    `puffle-t2`): the runs of one kind differ only in their seed, so they take about the same time."""
    return re.sub(r"-s\d+(?=-|$)", "", run_dir.name)


def _finished_walls(jobs: list[tuple[Path, list[str]]], finished: dict[Path, float] | None = None
                    ) -> tuple[dict[Path, float], dict[str, list[float]]]:
    """The finished jobs' wall times (read from their folders, each record once, unless given), and those walls by
    kind."""
    if finished is None:
        finished = {rd: wall for rd, _ in jobs if (wall := finished_wall(rd)) is not None}
    return finished, _walls_by_kind(finished)


def _walls_by_kind(finished: dict[Path, float]) -> dict[str, list[float]]:
    walls: dict[str, list[float]] = {}
    for rd, wall in finished.items():
        walls.setdefault(job_kind(rd), []).append(wall)
    return walls


def remaining_seconds(left: list[Path], finished: dict[Path, float], workers: int) -> float | None:
    """A rough time to finish the runs `left`: each as long as its kind's mean wall among the `finished` ones (the
    mean of all finished runs for a kind not seen yet), shared over the workers; None before any run finished."""
    if not finished:
        return None
    walls = _walls_by_kind(finished)
    overall = sum(finished.values()) / len(finished)
    times = [sum(k) / len(k) if (k := walls.get(job_kind(rd))) else overall for rd in left]
    return sum(times) / max(1, min(workers, len(times)))


def scheduled(jobs: list[tuple[Path, list[str]]], finished: dict[Path, float] | None = None
              ) -> list[tuple[Path, list[str]]]:
    """The jobs in the order to start them: finished jobs first (they only report), then unfinished jobs of a kind
    with no finished run yet (their length is unknown, so they must not come last) in the given order, then the others
    by their kind's mean finished wall time, longest first, so that the pool does not end on one long DP run while
    the other workers idle. Stable: equal keys keep the given order. `finished`: the finished runs' walls when the
    caller keeps them (run_jobs), else read from the run folders."""
    finished, walls = _finished_walls(jobs, finished)

    def key(job: tuple[Path, list[str]]) -> tuple[int, float]:
        rd = job[0]
        if rd in finished:
            return 0, 0.0
        known = walls.get(job_kind(rd))
        return (1, 0.0) if not known else (2, -sum(known) / len(known))

    return sorted(jobs, key=key)


class StoppedStarting(RuntimeError):
    """The command's start deadline passed with runs not started: the runs in flight finished (and, with a ledger,
    were recorded); the same command continues with the rest. No results file is written from a partial set."""


_START_DEADLINE: float | None = None  # time.monotonic() after which no run starts; one per command, like the ledger


def stop_starting_after(minutes: float | None) -> None:
    """Let the command's runs start only within `minutes` from now (None: no limit); set once per command (parse)."""
    global _START_DEADLINE
    if minutes is not None and minutes <= 0:
        raise ValueError(f"--stop-starting-after must be > 0 minutes, got {minutes}")
    _START_DEADLINE = None if minutes is None else time.monotonic() + 60.0 * minutes


def run_jobs(jobs: list[tuple[Path, list[str]]], workers: int,
             report: Callable[[str], None] = lambda line: print(line, flush=True),
             stop_file: Path | None = None) -> list[str]:
    """Train every (run_dir, overrides) not finished yet, `workers` at a time; each free worker takes the first
    waiting job in `scheduled` order as of that moment (so the runs that finished meanwhile inform it). Returns the
    failures' messages (one failed run never stops the others). Past the start deadline (stop_starting_after), or
    once `stop_file` exists (a user's `touch`, while the command runs), a free worker takes nothing more, and once
    the runs in flight finished StoppedStarting says how many are left; the stop file is then removed, so that the
    same command continues."""
    from resfl_lightning.analysis import run_ledger

    failures: list[str] = []
    waiting = list(jobs)
    lock = threading.Lock()
    done = 0
    deadline = _START_DEADLINE
    if (ledger := run_ledger.active()) is not None:
        ledger.sync(jobs, report)  # runs finished on an earlier machine count as finished here
    finished = _finished_walls(jobs)[0]  # read once, then kept up to date in memory (scheduling, time left)
    settled: set[Path] = set(finished)
    asked = False  # the stop file was seen: once asked, no run starts (removing the file does not resume)
    if stop_file is not None and len(finished) < len(jobs):
        report(f"to start no more runs (the runs in flight finish and are kept): touch {stop_file}")

    def take() -> tuple[Path, list[str]] | None:
        nonlocal asked
        with lock:
            asked = asked or (stop_file is not None and stop_file.exists())
            # Past the deadline only finished runs are taken: they start nothing, only report (and reach the ledger).
            past = asked or (deadline is not None and time.monotonic() >= deadline)
            names = {rd for rd, _ in waiting if not past or rd in finished}
            job = next((j for j in scheduled(jobs, finished) if j[0] in names), None)
            if job is not None:
                waiting.remove(job)
            return job

    def work() -> None:
        nonlocal done
        while (job := take()) is not None:
            rd, overrides = job
            wall = None
            try:
                wall = run_one(overrides, rd)
                line = f"{rd.name}: {wall:.0f} s"
            except Exception as err:  # noqa: BLE001  (a worker outlives any one job; the job is reported failed)
                message = str(err) if isinstance(err, RuntimeError) else f"run {rd}: {type(err).__name__}: {err}"
                line = f"FAILED: {message}"
                with lock:
                    failures.append(message)
            with lock:
                if wall is not None and ledger is not None and rd not in settled:
                    ledger.record(rd, overrides)
                done += 1
                settled.add(rd)
                if wall is not None:
                    finished[rd] = wall
                left = remaining_seconds([r for r, _ in jobs if r not in settled], finished, workers)
                eta = f"; about {left / 60:.0f} min left (the kinds' mean wall times)" if left else ""
                report(f"[{done}/{len(jobs)}] {line}{eta}")

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, min(workers, len(jobs))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if asked:
        stop_file.unlink(missing_ok=True)  # consumed: the next command in this folder starts its runs
    if waiting:
        why = f"as {stop_file} asked (now removed)" if asked else "at the --stop-starting-after deadline"
        raise StoppedStarting(
            f"stopped starting runs {why}: {len(waiting)} of {len(jobs)} runs not "
            f"started ({len(failures)} failed); the same command continues them"
            + (f" (commit {ledger.root} to continue on another machine)" if ledger is not None else ""))
    return failures
