"""Is the running environment exactly the committed lock? `python -m resfl_lightning.env_lock` prints every
difference between the installed distributions and requirements.lock and exits 1 on any (CI runs it after the
install): the same code on other package versions gives other final models."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from resfl_lightning.resources import PACKAGE_DIR

LOCK = PACKAGE_DIR.parent / "requirements.lock"
PROJECT = "resfl-lightning"  # installed editable beside the lock (`pip install --no-deps -e .`), not pinned in it
# What `python -m venv` puts in every environment before the lock is installed; checked only where the lock pins them
BOOTSTRAP = ("pip", "setuptools", "wheel")


def parse_lock(text: str) -> dict[str, str]:
    """Canonical name -> version of each `name==version` line (comments, `# via` notes, options, markers skipped)."""
    pins = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].split(";", 1)[0].rstrip("\\").strip()
        if not line or line.startswith("-"):
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"lock line {n} is not `name==version`: {raw.strip()!r}")
        name = canonicalize_name(name.split("[", 1)[0].strip())
        if name in pins:
            raise ValueError(f"lock line {n} pins {name} a second time")
        pins[name] = version.strip()
    return pins


def installed_distributions() -> dict[str, str]:
    """Canonical name -> version of each distribution on sys.path (the first one wins, as for import)."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), dist.version)
    return found


def _same(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def differences(locked: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One line per package that is missing, on another version, or installed but not locked."""
    out = []
    for name in sorted(locked.keys() | installed.keys()):
        want, have = locked.get(name), installed.get(name)
        if want is None:
            if name != PROJECT and name not in BOOTSTRAP:
                out.append(f"{name}=={have} is installed but not in the lock")
        elif have is None:
            out.append(f"{name}=={want} is locked but not installed")
        elif not _same(want, have):
            out.append(f"{name}: {have} installed, {want} locked")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resfl_lightning.env_lock", description=__doc__)
    parser.add_argument("--lock", type=Path, default=LOCK, help="the lock file (default: the checkout's)")
    args = parser.parse_args(argv)
    locked = parse_lock(args.lock.read_text())
    diff = differences(locked, installed_distributions())
    for line in diff:
        print(line)
    if diff:
        print(f"{len(diff)} difference(s) from {args.lock}; a fresh environment: rm -rf .venv && make install")
        return 1
    print(f"environment == {args.lock.name} ({len(locked)} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
