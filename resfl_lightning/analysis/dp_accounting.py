"""The DP-SGD accounting of finished runs: their summary.json `dp/` numbers (callbacks/reports.py) as `resfl
dp-curve` shows them beside each point of its curve and `resfl table` below its table: a DP method's utility is read
with its noise and noise-to-signal ratio beside it."""

from __future__ import annotations

import math
from pathlib import Path

from resfl_lightning.analysis.run_data import RunData, finished_run
from resfl_lightning.analysis.statistics import load_statistics
from resfl_lightning.metrics.statistics import below_utility_floor

# summary.json key -> the column it feeds (per run); the utility is accuracy, or mAP@50 for detection
DP_KEYS = {"z": "dp/noise_multiplier", "q": "dp/sample_rate", "steps": "dp/steps", "C": "dp/max_grad_norm",
           "delta": "dp/delta", "epsilon_spent": "dp/epsilon_max", "nsr": "dp/nsr",
           "epsilon_target": "dp/target_epsilon"}


def run_values(run: RunData | None, map50_floor: float | None = None) -> dict | None:
    """A finished run's utility and accounting numbers (None: not finished). The spent epsilon of a run without
    noise (z = 0) is inf (summary.json holds null there)."""
    if run is None:
        return None
    out = {name: run.value(key) for name, key in DP_KEYS.items()}
    if out["z"] == 0.0:
        out["epsilon_spent"] = math.inf
    out["utility"] = run.utility
    out["task"] = run.task
    floor = load_statistics().map50_floor if map50_floor is None else map50_floor  # the table's floor
    out["below_floor"] = below_utility_floor(run.summary, floor)
    return out


def _fmt(v: float, kind: str) -> str:
    if math.isinf(v):
        return "∞"
    return {"z": f"{v:.3g}", "q": f"{v:.4g}", "steps": f"{v:.0f}", "C": f"{v:g}", "delta": f"{v:g}",
            "epsilon_spent": f"{v:.3f}", "nsr": f"{v:.3g}", "epsilon_target": f"{v:g}"}[kind]


def same_cell(values: list[float], kind: str) -> str:
    """The value all seeds share, else their range; — when no run has it."""
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    if lo == hi or (math.isfinite(hi) and hi - lo <= 1e-9 * max(1.0, abs(hi))):
        return _fmt(hi, kind)
    return f"{_fmt(lo, kind)}–{_fmt(hi, kind)}"


def accounting_cells(runs: list[dict]) -> list[str]:
    """z, q, S_k, C, δ (the value the runs share, else their range), spent ε (the largest over the runs), NSR (the
    mean over the runs) of run_values() dicts; — where no run has the value."""
    def values(key: str) -> list[float]:
        return [r[key] for r in runs if r.get(key) is not None]

    spent, nsr = values("epsilon_spent"), values("nsr")
    return [*(same_cell(values(k), k) for k in ("z", "q", "steps", "C", "delta")),
            _fmt(max(spent), "epsilon_spent") if spent else "—", _fmt(sum(nsr) / len(nsr), "nsr") if nsr else "—"]


INTRO = ("DP-SGD accounting of the methods trained with it (summary.json `dp/`, as in `resfl dp-curve`): ε target "
         "the per-client target at δ, z the noise multiplier (the noise's std is z·C), q = B/n_k the Poisson sampling "
         "rate, S_k the DP-SGD steps a client took, C the clipping norm, δ (the value the seeds share, else their "
         "range); spent ε the accountant's ε (the largest over clients and seeds); NSR = zC/(B‖ḡ_c‖), the noise "
         "against the noise-free mean of the clipped per-sample gradients (median over steps and clients, then the "
         "mean over seeds). The utility at other ε: `resfl dp-curve`.")


def dp_accounting_lines(runs: dict[str, list[Path]]) -> list[str]:
    """The section's markdown lines for {method: its finished runs' folders}; [] when no method ran DP-SGD."""
    rows, floor = [], load_statistics().map50_floor  # read once, not once a run (run_values' default)
    for method, run_dirs in runs.items():
        values = [v for v in (run_values(finished_run(d), floor) for d in run_dirs)
                  if v is not None and v["z"] is not None]
        if values:
            target = same_cell([v["epsilon_target"] for v in values if v["epsilon_target"] is not None],
                               "epsilon_target")
            rows.append(f"| {method} | {len(values)} | {target} | " + " | ".join(accounting_cells(values)) + " |")
    if not rows:
        return []
    return ["", INTRO, "", "| method | n | ε target | z | q | S_k | C | δ | spent ε | NSR |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *rows]
