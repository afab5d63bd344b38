"""Where a results file's numbers came from: the command, the code's git commit, the date, the machine, the time."""

from __future__ import annotations

import datetime
from pathlib import Path

from resfl_lightning.analysis.checkout import git_commit, lock_hash, machine
from resfl_lightning.analysis.run_time_parts import time_parts_line


def run_commits_line(run_dirs: list[Path]) -> str | None:
    """The header's line on the code the runs were trained with (their launchers' records), None without runs."""
    from resfl_lightning.analysis.run_records import trained_commits

    counts, unknown = trained_commits(run_dirs)
    if not counts and not unknown:
        return None
    known = ", ".join(f"{c} ({n})" for c, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    missing = (f"{unknown} launched before runs recorded their commit (the ledger line says when they were recorded)"
               if unknown else "")
    return "- runs trained at: " + "; ".join(part for part in (known, missing) if part)


def provenance_lines(command: str, wall_s: float, runs_wall_s: float | None = None,
                     run_dirs: list[Path] | None = None) -> list[str]:
    from resfl_lightning.analysis import run_ledger

    runs = "" if runs_wall_s is None else f" (the runs' own wall times sum to {runs_wall_s:.0f} s)"
    lines = [f"- command: `{command}`", f"- commit: {git_commit()}",
             f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
             f"- packages: requirements.lock {lock_hash()} (the versions `make install` installs)",
             f"- machine: {machine()}", f"- wall time: {wall_s:.0f} s{runs}"]
    parts = time_parts_line(run_dirs) if run_dirs else None
    trained = run_commits_line(run_dirs) if run_dirs else None
    ledger = run_ledger.active()
    carried = ledger.provenance() if ledger is not None else None
    return lines + [line for line in (parts, trained, carried) if line]


def write_results(path: Path, body: str, command: str, wall_s: float, runs_wall_s: float | None = None,
                  writer: str = "resfl table", run_dirs: list[Path] | None = None) -> Path:
    """`body` (markdown starting with its `# title` line) with the provenance list under the title."""
    return write_with_provenance(path, body, writer, provenance_lines(command, wall_s, runs_wall_s, run_dirs))


def write_with_provenance(path: Path, body: str, writer: str, provenance: list[str]) -> Path:
    """write_results with its provenance lines already made (a caller writing several copies makes them once)."""
    title, _, rest = body.partition("\n")
    text = "\n".join([title, "", f"Written by `{writer}`; regenerate it with the command below instead of editing.",
                      "", *provenance, "", rest.lstrip("\n")])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
