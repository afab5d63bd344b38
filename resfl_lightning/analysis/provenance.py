"""Where a results file's numbers came from: the command, the code's git commit, the date, the machine, the time."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

from resfl_lightning.resources import PACKAGE_DIR

OUTPUTS = "docs/results"  # what the experiment commands write: a changed file there is an output, not the code


def git_commit(repo: Path = PACKAGE_DIR.parent) -> str:
    """HEAD of the checkout the code runs from, marked when tracked files outside OUTPUTS differ from it (a resumed
    command rewrites its own tracked results file); 'unknown' outside one."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":(exclude){OUTPUTS}"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        from resfl_lightning import __version__

        return f"unknown (resfl-lightning {__version__}, not run from a git checkout)"
    return f"{head} (with uncommitted changes)" if dirty else head


def machine() -> str:
    return (f"{platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}")


def provenance_lines(command: str, wall_s: float, runs_wall_s: float | None = None) -> list[str]:
    from resfl_lightning.analysis import run_ledger

    runs = "" if runs_wall_s is None else f" (the runs' own wall times sum to {runs_wall_s:.0f} s)"
    lines = [f"- command: `{command}`", f"- commit: {git_commit()}",
             f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
             f"- machine: {machine()}", f"- wall time: {wall_s:.0f} s{runs}"]
    ledger = run_ledger.active()
    carried = ledger.provenance() if ledger is not None else None
    return lines + ([carried] if carried else [])


def write_results(path: Path, body: str, command: str, wall_s: float, runs_wall_s: float | None = None,
                  writer: str = "resfl table") -> Path:
    """`body` (markdown starting with its `# title` line) with the provenance list under the title."""
    title, _, rest = body.partition("\n")
    text = "\n".join([title, "", f"Written by `{writer}`; regenerate it with the command below instead of editing.",
                      "", *provenance_lines(command, wall_s, runs_wall_s), "", rest.lstrip("\n")])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
