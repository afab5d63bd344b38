"""Where the runs' time went, from their own records: a results header's profile of its runs.

Each finished run's summary.json holds the per-round means of the orchestrator's timers (mean_time/*) over its
rounds_completed rounds, and the attacks that time themselves (attack/*_time, run inside the last round's
callbacks); table_wall_s.json holds its wall time. What no timer covers (process start, data, model, checkpoints,
the final files) is the rest of the wall time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from resfl_lightning.analysis.run_records import finished_wall

ROUND_PARTS = (("time/train", "local training"), ("time/validate", "client validation"),
               ("time/aggregate", "aggregation"))
ATTACK_PARTS = (("attack/mia_audit_time", "membership audit"), ("attack/mia_time", "membership attack"),
                ("attack/aia_time", "attribute inference"))
CALLBACKS, REST = "evaluation and other callbacks", "outside the timed rounds"
ORDER = (*(label for _, label in ROUND_PARTS), *(label for _, label in ATTACK_PARTS), CALLBACKS, REST)


def run_time_parts(summary: dict, wall_s: float) -> dict[str, float] | None:
    """Seconds per part of one run (labels of ORDER, summing to wall_s up to the clamps at 0); None when the summary
    has no round timings (a run that predates them or stopped before a round)."""
    rounds = summary.get("rounds_completed")
    if not isinstance(rounds, int | float) or not rounds or summary.get("mean_time/train") is None:
        return None

    def total(key: str) -> float:
        return float(summary.get(f"mean_{key}") or 0.0) * rounds

    rounds_parts = {label: total(key) for key, label in ROUND_PARTS}
    attacks = {label: float(summary.get(key) or 0.0) for key, label in ATTACK_PARTS}
    callbacks = total("time/callbacks")
    return {**rounds_parts, **attacks, CALLBACKS: max(callbacks - sum(attacks.values()), 0.0),
            REST: max(wall_s - sum(rounds_parts.values()) - callbacks, 0.0)}


def summed_time_parts(run_dirs: Iterable[Path]) -> tuple[dict[str, float], int]:
    """(seconds per part summed over the finished runs that have timings, how many runs that is)."""
    sums = dict.fromkeys(ORDER, 0.0)
    counted = 0
    for run_dir in run_dirs:
        wall = finished_wall(run_dir)
        if wall is None:
            continue
        parts = run_time_parts(json.loads((run_dir / "summary.json").read_text()), wall)
        if parts is None:
            continue
        counted += 1
        for label, seconds in parts.items():
            sums[label] += seconds
    return sums, counted


def time_parts_line(run_dirs: Iterable[Path]) -> str | None:
    """The header's line on where the runs' time went (parts under 0.5 % left out), None without timed runs."""
    sums, counted = summed_time_parts(run_dirs)
    whole = sum(sums.values())
    if not counted or whole <= 0:
        return None
    shown = [f"{label} {seconds:.0f} s ({100 * seconds / whole:.0f} %)" for label, seconds in sums.items()
             if seconds / whole >= 0.005]
    runs = f"{counted} run" + ("s" if counted > 1 else "")
    return f"- the runs' time by part ({runs}, their own timers): " + ", ".join(shown)
