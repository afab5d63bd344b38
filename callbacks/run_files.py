"""Run-directory outputs (always written, whatever the logger): metrics.jsonl, summary.json; and the logger feed."""

from __future__ import annotations

import json
import math
from pathlib import Path

SUMMARY_PREFIXES = ("test/", "attack/", "score/", "weather/", "dp/")


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class RunFiles:
    def __init__(self, run_dir: Path, resume: bool = False):
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.summary: dict[str, float] = {}

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    def on_fit_start(self, federation, state) -> None:
        if not federation.fabric.is_global_zero:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if federation.config is not None:
            from omegaconf import OmegaConf

            (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(federation.config, resolve=True))
        if not self.metrics_path.exists():
            return
        # Keep rounds already checkpointed when resuming; a fresh run starts a fresh file.
        keep = []
        if self.resume:
            for line in self.metrics_path.read_text().splitlines():
                row = json.loads(line) if line.strip() else None
                if row is not None and ("round" not in row or row["round"] <= state.round_idx):
                    keep.append(line)
        self.metrics_path.write_text("".join(f"{line}\n" for line in keep))

    def on_metrics(self, federation, round_idx: int, metrics: dict) -> None:
        fabric = federation.fabric
        fabric.log_dict({k: float(v) for k, v in metrics.items()}, step=round_idx)
        if not fabric.is_global_zero:
            return
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps({k: _jsonable(v) for k, v in metrics.items()}) + "\n")
        self.summary.update({k: v for k, v in metrics.items() if k.startswith(SUMMARY_PREFIXES)})
        self.summary["rounds_completed"] = round_idx + 1

    def on_fit_end(self, federation) -> None:
        if not federation.fabric.is_global_zero:
            return
        timings = self._mean_timings()
        self.summary.update(timings)
        (self.run_dir / "summary.json").write_text(json.dumps({k: _jsonable(v) for k, v in self.summary.items()},
                                                              indent=2, sort_keys=True))
        for logger in federation.fabric.loggers:
            logger.finalize("success")

    def _mean_timings(self) -> dict[str, float]:
        rows = [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]
        keys = sorted({k for r in rows for k in r if k.startswith("time/")})
        return {f"mean_{k}": sum(r[k] for r in rows if k in r) / max(len(rows), 1) for k in keys}
