"""One finished run as the experiment commands read it (frontier, robustness, dp-curve, tune): its summary.json
(the final evaluation's values, callbacks/run_files.py) and its task, with finite-or-None values."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.values import finite

# The task's utility in the experiment commands' rules: detection mAP@50, classification accuracy.
UTILITY_KEYS = {"detection": "test/map_50", "classification": "test/accuracy"}


@dataclass
class FinishedRun:
    run_dir: Path
    summary: dict

    @cached_property
    def task(self) -> str:
        return str(OmegaConf.load(self.run_dir / "config.yaml").dataset.task)

    def value(self, key: str) -> float | None:
        return finite(self.summary.get(key))

    @property
    def utility(self) -> float | None:
        return self.value(UTILITY_KEYS.get(self.task, "test/accuracy"))


def finished_run(run_dir: Path) -> FinishedRun | None:
    """The run in `run_dir`, or None while it has no summary.json (not finished)."""
    if not (run_dir / "summary.json").is_file():
        return None
    return FinishedRun(run_dir, json.loads((run_dir / "summary.json").read_text()))
