"""Memoising a pure, deterministic computation on disk (one small JSON file per key under the project cache), so
that the runs of a table share what each would otherwise recompute, e.g. opacus' noise-multiplier search."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from resfl_lightning.env import cache_dir


def disk_memo(namespace: str, key: dict, compute: Callable[[], float], root: Path | None = None) -> float:
    """compute() once per (namespace, key); later calls, in any process, read the stored float back.

    The key must name everything the value depends on (library versions included). A file that cannot be read is
    recomputed and rewritten; writes go through a temporary file and a rename, so concurrent runs never read half a
    file. Floats round-trip through JSON exactly (repr)."""
    text = json.dumps(key, sort_keys=True)
    folder = (root or cache_dir()) / namespace
    path = folder / (hashlib.sha256(text.encode()).hexdigest()[:32] + ".json")
    try:
        stored = json.loads(path.read_text())
        if stored["key"] == key:
            return float(stored["value"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = float(compute())
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump({"key": key, "value": value}, fh)
        os.replace(tmp, path)
    except OSError:  # a read-only cache costs time, never the run
        pass
    return value
