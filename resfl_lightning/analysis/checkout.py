"""Where the code runs: the checkout's git commit, its package lock and the machine (for results headers and run
ledger entries)."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
from pathlib import Path

from resfl_lightning.env_lock import LOCK
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


def lock_hash(lock: Path = LOCK) -> str:
    """First 12 hex digits of the sha256 of the checkout's requirements.lock (the package versions `make install`
    installs; `python -m resfl_lightning.env_lock` checks the environment has them); 'unknown' outside a checkout."""
    try:
        return hashlib.sha256(lock.read_bytes()).hexdigest()[:12]
    except OSError:
        return f"unknown (no {lock.name} beside the package)"


DIRTY_MARK = "+dirty"  # after a short commit: recorded from a tree with uncommitted changes


def commit_label(commit: str) -> str:
    """A git_commit() in 12 characters, marked when it said the tree had uncommitted changes."""
    return commit.split(" ")[0][:12] + (DIRTY_MARK if "uncommitted" in commit else "")


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what platform knows of the processor."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def kernels() -> str:
    """The math kernels a CPU run dispatches to: torch's version and vector ISA and the BLAS it was built with. Two
    machines with one lock and another ISA train other floats (docs/design.md, Invariants)."""
    import torch

    blas = "MKL" if torch.backends.mkl.is_available() else "no MKL"
    return f"torch {torch.__version__} {torch.backends.cpu.get_cpu_capability()} {blas}"


def machine() -> str:
    return (f"{platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs ({cpu_model()}), {kernels()}, "
            f"Python {platform.python_version()}")


def kernel_label(machine_text: str) -> str:
    """The part of a machine() string that decides a run's floats: the CPU model and torch's kernels. Strings
    recorded before 9945b40 (2026-12-01) named neither."""
    found = re.search(r"CPUs \((.*)\), (torch [^,]*)", machine_text or "")
    return f"{found.group(1)}, {found.group(2)}" if found else "CPU and kernels not recorded"
