"""One run folder as every reader of runs sees it (the experiments, compare, report, the table's columns): its final
values, its per-round rows and the two configs a run saves (callbacks/run_files.py), each file read when first
asked for (a grid reads thousands of runs and most readers need only the summary)."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from resfl_lightning.values import finite

# The task's utility in the experiments' rules: detection mAP@50, classification accuracy.
UTILITY_KEYS = {"detection": "test/map_50", "classification": "test/accuracy"}


class RunData:
    def __init__(self, path: Path, summary: dict | None = None):
        self.path = Path(path)
        self._summary = summary

    @property
    def name(self) -> str:
        return self.path.name

    @cached_property
    def summary(self) -> dict:
        """summary.json (the final evaluation), else the rows merged (a run still going)."""
        if self._summary is not None:
            return self._summary
        if (self.path / "summary.json").is_file():
            return json.loads((self.path / "summary.json").read_text())
        merged: dict = {}
        for row in self.rows:
            merged.update({k: v for k, v in row.items() if v is not None})
        return merged

    @cached_property
    def rows(self) -> list[dict]:
        """metrics.jsonl, one row per round ([] when absent)."""
        metrics = self.path / "metrics.jsonl"
        return read_rows(metrics) if metrics.is_file() else []

    @cached_property
    def config(self) -> dict[str, Any]:
        """config.yaml: the resolved config the run saved when it started ({} when absent)."""
        return _yaml(self.path / "config.yaml")

    @cached_property
    def hydra_config(self) -> dict[str, Any]:
        """.hydra/config.yaml: the config as composed, interpolations kept ({} when absent)."""
        return _yaml(self.path / ".hydra" / "config.yaml")

    @property
    def task(self) -> str:
        return str((self.config.get("dataset") or {}).get("task", "classification"))

    def value(self, key: str) -> float | None:
        """A final value as a float, None when absent or not finite."""
        return finite(self.summary.get(key))

    @property
    def utility(self) -> float | None:
        """The task's utility (UTILITY_KEYS)."""
        return self.value(UTILITY_KEYS.get(self.task, "test/accuracy"))


def read_rows(metrics: Path) -> list[dict]:
    """The JSON-lines rows of `metrics`; a line that is not JSON names the file and line."""
    rows = []
    for n, line in enumerate(metrics.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{metrics}:{n}: not a JSON object ({err})") from err
    return rows


def _yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def load_run(run_dir: Path | str) -> RunData:
    """The run in `run_dir`; FileNotFoundError when it is no run folder (neither summary.json nor metrics.jsonl)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {path} does not exist")
    if not (path / "summary.json").is_file() and not (path / "metrics.jsonl").is_file():
        raise FileNotFoundError(f"{path} has neither summary.json nor metrics.jsonl: is it a run directory "
                                "(runs/<run_name>)?")
    return RunData(path)


def finished_run(run_dir: Path) -> RunData | None:
    """The run in `run_dir` once finished (its summary.json written), else None."""
    return RunData(run_dir) if (Path(run_dir) / "summary.json").is_file() else None
