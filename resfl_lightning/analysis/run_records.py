"""What a table run's folder says about it: the wall time the launcher recorded when it finished, and whether it
finished (read by the launcher, the scheduler and the stale-run check)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path


def recorded_wall(run_dir: Path) -> float | None:
    """The run's wall time as the launcher recorded it when the run finished; None when not (yet) readable."""
    try:
        return float(json.loads((run_dir / "table_wall_s.json").read_text())["wall_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def summed_wall(run_dirs: Iterable[Path]) -> float:
    """The recorded wall times of the runs that have one, summed (the results headers' "the runs' own wall times")."""
    timings = (run_dir / "table_wall_s.json" for run_dir in run_dirs)
    return sum(json.loads(p.read_text())["wall_s"] for p in timings if p.is_file())


def trained_commits(run_dirs: Iterable[Path]) -> tuple[dict[str, int], int]:
    """(commit -> runs, runs without one) over the finished runs: the commit each run's launcher recorded when it
    started it (short, marked +dirty when the tree had uncommitted changes); runs launched before the launcher
    recorded it have none."""
    from resfl_lightning.analysis.checkout import commit_label

    commits = [json.loads((run_dir / "table_wall_s.json").read_text()).get("commit") for run_dir in run_dirs
               if (run_dir / "table_wall_s.json").is_file() and (run_dir / "summary.json").is_file()]
    return dict(Counter(commit_label(c) for c in commits if c is not None)), commits.count(None)


def finished_wall(run_dir: Path) -> float | None:
    """The wall time of a finished run (its summary written and its timing recorded), None for any other run."""
    return recorded_wall(run_dir) if (run_dir / "summary.json").is_file() else None


def is_finished(run_dir: Path) -> bool:
    return finished_wall(run_dir) is not None
