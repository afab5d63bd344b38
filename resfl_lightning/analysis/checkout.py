"""Where the code runs: the checkout's git commit and the machine (for results headers and run ledger entries)."""

from __future__ import annotations

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
