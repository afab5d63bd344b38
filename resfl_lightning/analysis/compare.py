"""Paired-run metrics (docs/method.md): BA AD, DPA EODD and, with a FedAvg baseline, FATE, from two finished runs
(`resfl compare CLEAN_RUN_DIR OTHER_RUN_DIR [--fate-baseline]`, resfl_lightning/cli/compare.py).

BA AD    = (mAP_clean - mAP_other) / mAP_clean            (test/map, also test/map_50 as ba_ad_50; classification:
                                                           test/accuracy)
DPA EODD = EOD_other - EOD_clean                          (test/eod, logged by the `eod` attack measurement)
Privacy Score change = PS_other - PS_clean, PS = (MIA balanced accuracy + AIA balanced accuracy) / 2, recomputed from
           attack/mia_success_rate and attack/aia_balanced_accuracy (only when a run has the privacy attacks)
FATE     = (ACC_f - ACC_b)/ACC_b + lambda_F (EO_b - EO_f)/EO_b with CLEAN = the FedAvg baseline b and OTHER = the
           method f; ACC = test/accuracy (classification) or test/map (detection), EO = test/eo_gap or test/delta_eop.
Each run's final values come from its summary.json (metrics.jsonl when that is missing). A metric whose inputs are
missing or undefined is reported as null with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resfl_lightning.analysis.run_data import RunData
from resfl_lightning.metrics.fairness import privacy_score
from resfl_lightning.metrics.fate import fate
from resfl_lightning.metrics.robustness import relative_drop
from resfl_lightning.metrics.statistics import no_positive_at_threshold

# Config keys two paired runs must share for the difference to measure the attack (or the method) alone.
PAIRED_KEYS = ("seed", "dataset", "model", "federation", "optim")


def _entry(clean: float | None, other: float | None, fn, keys: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"value": None, "clean": clean, "other": other, "inputs": keys}
    if clean is None or other is None:
        entry["reason"] = f"missing {keys} in {'the clean run' if clean is None else 'the other run'}"
        return entry
    try:
        entry["value"] = float(fn(clean, other))
    except ValueError as err:
        entry["reason"] = str(err)
    return entry


def nothing_detected(clean: RunData, other: RunData) -> str | None:
    """Why the group-rate differences (DPA EODD, FATE's EO) of the pair compare nothing: a run with TPR 0 in every
    group at the operating threshold (metrics/statistics.py::no_positive_at_threshold); None when both detect."""
    for name, run in (("the clean run", clean), ("the other run", other)):
        why = no_positive_at_threshold(run.summary)
        if why is not None:
            return f"{name} detects nothing ({why})"
    return None


def run_privacy_score(run: RunData) -> float | None:
    """(MIA SR + AIA SR)/2 from the run's balanced accuracies (never from a stored score of another definition)."""
    mia, aia = run.value("attack/mia_success_rate"), run.value("attack/aia_balanced_accuracy")
    return None if mia is None or aia is None else privacy_score(mia, aia)


def config_differences(clean: RunData, other: RunData) -> list[str]:
    """Top-level config sections (PAIRED_KEYS) that differ between the runs (attack and algorithm may differ)."""
    if not clean.hydra_config or not other.hydra_config:
        return []
    return [k for k in PAIRED_KEYS if clean.hydra_config.get(k) != other.hydra_config.get(k)]


def compare_runs(clean: RunData, other: RunData, fate_baseline: bool = False, lambda_f: float = 1.0) -> dict[str, Any]:
    """The comparison dict: metrics (name -> {value, clean, other, inputs[, reason]}) and warnings."""
    utility = "test/map" if clean.value("test/map") is not None else "test/accuracy"
    nothing = nothing_detected(clean, other)
    metrics = {
        "ba_ad": _entry(clean.value(utility), other.value(utility), relative_drop, utility),
        "dpa_eodd": _entry(clean.value("test/eod"), other.value("test/eod"),
                           lambda c, o: o - c, "test/eod"),
    }
    if nothing is not None:
        metrics["dpa_eodd"] |= {"value": None, "reason": nothing}
    scores = (run_privacy_score(clean), run_privacy_score(other))
    if scores != (None, None):
        metrics["privacy_score_change"] = _entry(*scores, lambda c, o: o - c,
                                                 "(attack/mia_success_rate + attack/aia_balanced_accuracy)/2")
    if utility == "test/map":
        metrics["ba_ad_50"] = _entry(clean.value("test/map_50"), other.value("test/map_50"),
                                     relative_drop, "test/map_50")
    if fate_baseline:
        acc = "test/accuracy" if clean.value("test/accuracy") is not None else "test/map"
        eo = "test/eo_gap" if clean.value("test/eo_gap") is not None else "test/delta_eop"
        accs = (clean.value(acc), other.value(acc))
        eos = (clean.value(eo), other.value(eo))
        entry: dict[str, Any] = {"value": None, "clean": {acc: accs[0], eo: eos[0]},
                                 "other": {acc: accs[1], eo: eos[1]}, "inputs": f"{acc}, {eo}", "lambda_f": lambda_f}
        if nothing is not None:
            entry["reason"] = nothing
        elif None in accs or None in eos:
            entry["reason"] = f"missing {acc} or {eo} in one of the runs"
        else:
            try:
                entry["value"] = fate(accs[1], accs[0], eos[1], eos[0], lambda_f=lambda_f)
            except ValueError as err:
                entry["reason"] = str(err)
        metrics["fate"] = entry
    warnings = [f"the runs differ in config section '{k}': the paired metrics then mix the attack with that change"
                for k in config_differences(clean, other)]
    return {"clean_run": str(clean.path), "other_run": str(other.path), "metrics": metrics, "warnings": warnings}


def format_value(v: Any) -> str:
    """4 decimals, or 4 significant digits for tiny non-zero values (early-training mAP)."""
    if isinstance(v, dict):
        return ", ".join(format_value(x) for x in v.values())
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:.3e}" if v != 0 and abs(v) < 1e-3 else f"{v:.4f}"


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{result['other_run']}  vs clean  {result['clean_run']}")
    for col, justify in (("metric", "left"), ("value", "right"), ("clean", "right"), ("other", "right"),
                         ("from", "left")):
        table.add_column(col, justify=justify)

    for name, e in result["metrics"].items():
        table.add_row(name, format_value(e["value"]) if e["value"] is not None else "n/a",
                      format_value(e["clean"]), format_value(e["other"]), e["inputs"])
    console = Console()
    console.print(table)
    for name, e in result["metrics"].items():
        if e["value"] is None:
            console.print(f"{name}: n/a: {e['reason']}")
    for w in result["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {w}")


def log_wandb(result: dict[str, Any], other_dir: Path, project: str) -> None:
    """One offline W&B run (job_type=compare) holding the paired metrics as its summary."""
    import wandb

    run = wandb.init(project=project, dir=str(other_dir), mode="offline", job_type="compare",
                     name=f"compare-{other_dir.name}", config={"clean_run": result["clean_run"],
                                                               "other_run": result["other_run"]})
    values = {f"compare/{k}": e["value"] for k, e in result["metrics"].items() if e["value"] is not None}
    run.log(values)
    run.summary.update(values)
    run.finish()
