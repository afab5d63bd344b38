"""The detection robustness subset on a GPU: every defence of the subset (conf/table/robustness.yaml) under every
attack of the subset, a short run each (`--rounds`, default 2) with `fabric=gpu`, several at once on one device.

A CPU grid cannot show a defence that breaks on CUDA (a tensor left on the CPU, a float64 op the device refuses):
fault isolation would drop the clients or skip the round and the run would still finish. So a run passes only when
it exits 0, completes every round, drops no client, skips no round and reports a finite test mAP@50.

    python -m resfl_lightning.benchmarks.device_check --out DIR [--rounds 2] [--jobs 6] [--defences multi_krum ...]

writes DIR/device_check.md (the results header of analysis/provenance.py; one row per run) and exits 1 when a run
fails. Not a measurement of robustness: two rounds learn nothing worth comparing."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from resfl_lightning.analysis.portable_paths import portable_command
from resfl_lightning.analysis.provenance import write_results
from resfl_lightning.analysis.robustness_grid import (
    CLEAN,
    Cell,
    grid_cells,
    load_grid,
    run_dir_for,
    select,
    train_overrides,
)
from resfl_lightning.analysis.run_data import finished_run

SEED = 0


def planned_cells(grid: dict) -> list[Cell]:
    """Each defence's clean cell and every attack on it, the `lie` report where the defence reads reports (the
    attacker that tries to buy weight), else `honest`."""
    cells = []
    for cell in grid_cells(grid):
        if cell.attack == CLEAN or cell.report == ("lie" if cell.defence in grid["reads_reports"] else "honest"):
            cells.append(cell)
    return cells


def run_overrides(grid: dict, cell: Cell, out: Path, rounds: int, fabric: str = "gpu") -> list[str]:
    extra = [f"fabric={fabric}", "fabric.threads_per_process=2", f"federation.rounds={rounds}"]
    return train_overrides("synthetic", "group_skew", grid, cell, seed=SEED, out=out, overrides=extra)


@dataclass(frozen=True)
class Outcome:
    cell: Cell
    rc: int
    wall_s: float
    rounds_completed: int | None
    dropped: float
    skipped: int
    map_50: float | None

    def passed(self, rounds: int) -> bool:
        return (self.rc == 0 and self.rounds_completed == rounds and self.dropped == 0 and self.skipped == 0
                and self.map_50 is not None)


def read_outcome(cell: Cell, run_dir: Path, rc: int, wall_s: float, log: str) -> Outcome:
    """What a finished (or failed) run left: summary.json (a non-finite mAP@50 reads as None), the per-round
    `round/dropped` of metrics.jsonl and the orchestrator's 'skipped, theta_G unchanged' warnings in its log."""
    run = finished_run(run_dir)
    dropped = 0.0
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            if line.strip():
                dropped += float(json.loads(line).get("round/dropped", 0.0))
    completed = None if run is None else run.value("rounds_completed")
    return Outcome(cell, rc, wall_s, None if completed is None else int(completed), dropped,
                   log.count("skipped, theta_G unchanged"), None if run is None else run.value("test/map_50"))


def run_one(grid: dict, cell: Cell, out: Path, rounds: int, timeout_s: int, fabric: str) -> Outcome:
    overrides = run_overrides(grid, cell, out, rounds, fabric)
    run_dir = run_dir_for(out, cell, SEED)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "resfl_lightning", "train", *overrides], capture_output=True,
                              text=True, timeout=timeout_s)
        rc, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, log = 124, str(exc.stdout or "") + str(exc.stderr or "")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "device_check.log").write_text(log)
    return read_outcome(cell, run_dir, rc, time.perf_counter() - t0, log)


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"


def report(outcomes: list[Outcome], rounds: int, title: str) -> str:
    lines = [title, "",
             "| defence | attack | report | rc | rounds | dropped | skipped | test mAP@50 | wall s | passed |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for o in outcomes:
        m = "-" if o.map_50 is None else f"{o.map_50:.4g}"
        lines.append(f"| {o.cell.defence} | {o.cell.attack} | {o.cell.report} | {o.rc} | {o.rounds_completed} | "
                     f"{o.dropped:g} | {o.skipped} | {m} | {o.wall_s:.0f} | {'yes' if o.passed(rounds) else 'NO'} |")
    failed = sum(not o.passed(rounds) for o in outcomes)
    lines += ["", f"{len(outcomes) - failed} of {len(outcomes)} runs passed."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per run")
    parser.add_argument("--fabric", default="gpu", help="conf/fabric/ preset (cpu: a smoke test of this script)")
    parser.add_argument("--defences", nargs="+", default=None, help="only these defences of the subset")
    parser.add_argument("--limit", type=int, default=None, help="only the first N runs")
    parser.add_argument("--commit", default=None, help="the commit the tree was copied from, where it has no .git")
    args = parser.parse_args(argv)
    grid = select(load_grid(), "detection")
    cells = [c for c in planned_cells(grid) if args.defences is None or c.defence in args.defences][:args.limit]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda c: run_one(grid, c, args.out / "runs", args.rounds, args.timeout, args.fabric),
                                 cells))
    title = f"# Detection robustness subset on {device_name()}: {len(cells)} runs of {args.rounds} rounds"
    if args.commit:
        title += f" (tree copied from commit {args.commit})"
    writer = "python -m resfl_lightning.benchmarks.device_check"
    command = f"{writer} {portable_command(sys.argv[1:] if argv is None else argv)}"
    path = write_results(args.out / "device_check.md", report(outcomes, args.rounds, title), command,
                         time.perf_counter() - t0, writer=writer)
    print(path.read_text())
    return 0 if all(o.passed(args.rounds) for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
