"""Run-directory outputs (always written, whatever the logger): metrics.jsonl, summary.json; and the logger feed.

summary.json holds the final round's values only: a metric the final round did not compute, or computed as NaN, is
null there with its reason under `missing_reasons`, never a value carried over from an earlier round (a Fairness
Score of round 10 must not stand for a final model whose |1-DI| is undefined). With metrics.min_group_size > 1 it
also names the groups the final evaluation left out of the group metrics (`test/groups_excluded`: name -> units).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from resfl_lightning.callbacks.evaluation import group_names
from resfl_lightning.metrics.statistics import majority_class_rate

SUMMARY_PREFIXES = ("test/", "val/", "attack/", "score/", "weather/", "dp/")


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class RunFiles:
    def __init__(self, run_dir: Path, resume: bool = False, evaluation=None):
        self.run_dir = Path(run_dir)
        self.resume = resume
        self.evaluation = evaluation  # the run's GlobalEvaluation: which groups its passes left out
        self.summary: dict[str, float] = {}
        self.final: dict[str, float] = {}  # the summary metrics of the latest round logged
        self.final_round: int | None = None
        self.last_seen: dict[str, int] = {}  # summary metric -> the last round that logged it

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
        self.final = {k: v for k, v in metrics.items() if k.startswith(SUMMARY_PREFIXES)}
        self.final_round = round_idx
        self.last_seen.update({k: round_idx for k in self.final})
        self.summary["rounds_completed"] = round_idx + 1

    def on_fit_end(self, federation) -> None:
        if not federation.fabric.is_global_zero:
            return
        self.summary.update(final_summary(self.final, self.final_round, self.last_seen))
        self.summary.update(self._mean_timings())
        if self.evaluation is not None:
            self.summary.update(self.evaluation.groups_excluded(group_names(federation.data)))
        for split in ("test", "val"):
            majority = classification_majority_rate(federation.data, split)
            if majority is not None:
                self.summary[f"{split}/majority_class_rate"] = majority
        (self.run_dir / "summary.json").write_text(json.dumps({k: _jsonable(v) for k, v in self.summary.items()},
                                                              indent=2, sort_keys=True))
        for logger in federation.fabric.loggers:
            logger.finalize("success")

    def _mean_timings(self) -> dict[str, float]:
        rows = [json.loads(line) for line in self.metrics_path.read_text().splitlines() if line.strip()]
        keys = sorted({k for r in rows for k in r if k.startswith("time/")})
        return {f"mean_{k}": sum(r[k] for r in rows if k in r) / max(len(rows), 1) for k in keys}


def final_summary(final: dict, final_round: int | None, last_seen: dict[str, int]) -> dict:
    """The final round's metrics; a metric logged earlier but not in the final round, or NaN there, becomes None with
    its reason in `missing_reasons` (metric -> reason)."""
    out: dict = {}
    reasons: dict[str, str] = {}
    for key in sorted(last_seen):
        if key in final:
            v = final[key]
            out[key] = v
            if isinstance(v, float) and not math.isfinite(v):
                reasons[key] = f"undefined ({v}) in the final round {final_round}"
        else:
            out[key] = None
            reasons[key] = f"not computed in the final round {final_round} (last in round {last_seen[key]})"
    out["missing_reasons"] = reasons
    return out


def classification_majority_rate(data, split: str = "test") -> float | None:
    """Accuracy of a constant prediction on a classification split: `test` (the table's utility floor) or `val`, the
    union of the clients' validation splits (what `resfl tune` reads); None for other tasks. Read from the label
    array, never through a loader (a loader's workers would draw from the torch RNG)."""
    from resfl_lightning.data.federated import base_data

    data = base_data(data)
    if getattr(data, "task", None) != "classification" or not hasattr(data, "y") or not hasattr(data, "splits"):
        return None
    if split == "test":
        rows = np.asarray(data.splits.test, dtype=np.int64)
    else:
        clients = getattr(data.splits, "clients", [])
        rows = np.concatenate([np.asarray(c.val, dtype=np.int64) for c in clients] or [np.zeros(0, np.int64)])
    labels = np.asarray(data.y)[rows]
    return majority_class_rate(labels) if labels.size else None
