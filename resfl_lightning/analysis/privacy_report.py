"""One command for the privacy comparison: RESFL and FedAvg on the same data and seed, each attacked by the
honest-but-curious server (attack=privacy), reported side by side.

    resfl privacy [--out runs/privacy-report] [--algorithms resfl fedavg]
                  [--robustness [--byzantine-reports honest sent lie]] [--jobs N] [HYDRA_OVERRIDE ...]

Each algorithm is one run of the real entry point (`python -m resfl_lightning.train algorithm=A attack=privacy
run_dir=OUT/A ...` plus the overrides), trained through the one experiment pipeline (analysis/execute.py: a finished
run is reused once its saved config is what its command composes now). With --robustness each algorithm also gets a
Byzantine run (attack=byzantine) and a poisoning run (attack=poisoning); their BA AD and DPA EODD are taken against
the privacy run, which trains exactly like a clean run (the privacy attacks are passive: they run after aggregation
on an isolated RNG) and logs test/eod. --byzantine-reports runs one Byzantine run per report mode (what attackers
report as u: attacks/byzantine.py) and reports BA AD for each. The table goes to stdout, everything to
OUT/privacy_report.json. Privacy Score = (MIA balanced accuracy + AIA balanced accuracy) / 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from resfl_lightning.analysis.compare import compare_runs, format_value
from resfl_lightning.analysis.execute import Context, Experiment, PlannedRun, Report, Runs, experiment_out
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.run_records import recorded_wall

ROWS = (
    ("mAP@50-95", "test/map"),
    ("mAP@50", "test/map_50"),
    ("accuracy (classification)", "test/accuracy"),
    ("Fairness Score (|1-DI|+dEOP)/2", "score/fairness"),
    ("EOD (protected vs rest)", "test/eod"),
    ("MIA SR (balanced accuracy)", "attack/mia_success_rate"),
    ("MIA SR threshold (shadow validation)", "attack/mia_threshold"),
    ("MIA AUC", "attack/mia_auc"),
    ("MIA TPR @ FPR 1% (shadow thresholds)", "attack/mia_tpr_at_fpr_1"),
    ("MIA TPR @ FPR 5% (shadow thresholds)", "attack/mia_tpr_at_fpr_5"),
    ("MIA TPR @ FPR 10% (shadow thresholds)", "attack/mia_tpr_at_fpr_10"),
    ("MIA TPR @ FPR 1/5/10% oracle (target thresholds)", ("attack/mia_oracle_tpr_at_fpr_1",
                                                           "attack/mia_oracle_tpr_at_fpr_5",
                                                           "attack/mia_oracle_tpr_at_fpr_10")),
    ("MIA SR on held-out shadow rows", "attack/mia_shadow_success_rate"),
    ("MIA members / non-members", "attack/mia_n_members"),
    ("AIA SR (balanced accuracy)", "attack/aia_balanced_accuracy"),
    ("AIA top-1", "attack/aia_top1"),
    ("AIA macro-F1", "attack/aia_macro_f1"),
    ("AIA chance 1/G / majority share", ("attack/aia_chance_uniform", "attack/aia_chance_majority")),
    ("AIA samples (persons)", "attack/aia_n_samples"),
    ("update-AIA balanced accuracy", "attack/update_aia_balanced_accuracy"),
    ("update-AIA top-1 / macro-F1", ("attack/update_aia_top1", "attack/update_aia_macro_f1")),
    ("update-AIA chance 1/G / majority share", ("attack/update_aia_chance_uniform",
                                                 "attack/update_aia_chance_majority")),
    ("update-AIA applicable (0 = IID)", "attack/update_aia_applicable"),
    ("Privacy Score (MIA BA + AIA BA)/2", "score/privacy"),
)
ROBUSTNESS_ROWS = (("BA AD (rel. mAP / acc. drop, Byzantine)", "ba_ad"), ("DPA EODD (poisoning)", "dpa_eodd"))


def robustness_runs(byzantine_reports: list[str]) -> list[tuple[str, str, str, list[str]]]:
    """(attack group, result key, run name, extra overrides): a Byzantine run per report mode, then poisoning.
    The honest mode keeps the plain names (ba_ad, <algo>-byzantine); the others get a suffix (ba_ad_sent)."""
    runs = []
    for mode in byzantine_reports:
        suffix = "" if mode == "honest" else f"_{mode}"
        runs.append(("byzantine", f"ba_ad{suffix}", f"byzantine{suffix.replace('_', '-')}",
                     [f"attack.byzantine.report={mode}"]))
    return runs + [("poisoning", "dpa_eodd", "poisoning", [])]


def run_overrides(algorithm: str, attack: str, run_dir: Path, overrides: list[str]) -> list[str]:
    return [f"algorithm={algorithm}", f"attack={attack}", f"run_dir={run_dir}", "progress=false", *overrides]


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) >= 2:
        return f"{int(v)}"
    return format_value(v)


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    algos = list(report["runs"])
    robust = {a: report["runs"][a]["robustness"] if "robustness" in report["runs"][a] else {} for a in algos}
    table = Table(title="Privacy under an honest-but-curious server (lower SR / score = more private)")
    table.add_column("metric")
    for a in algos:
        table.add_column(a, justify="right")
    for label, keys in ROWS:
        keys = keys if isinstance(keys, tuple) else (keys,)
        table.add_row(label, *[" / ".join(_fmt(report["runs"][a]["metrics"].get(k)) for k in keys) for a in algos])
    if any(robust.values()):
        for label, key in ROBUSTNESS_ROWS:
            table.add_row(label, *[_fmt(robust[a].get(key)) for a in algos])
        for mode in ("sent", "lie"):
            if any(f"ba_ad_{mode}" in robust[a] for a in algos):
                table.add_row(f"BA AD, attackers report u '{mode}'",
                              *[_fmt(robust[a].get(f"ba_ad_{mode}")) for a in algos])
    table.add_row("wall time (s)", *[f"{report['runs'][a]['wall_s']:.1f}" for a in algos])
    Console().print(table)


class PrivacyComparison(Experiment):
    """RESFL and FedAvg (ctx.options `algorithms`) attacked for privacy, with ctx.options `robustness` a Byzantine
    run per report mode (`byzantine_reports`) and a poisoning run each; privacy.md and privacy_report.json."""

    writer = "resfl privacy"

    def default_out(self, ctx: Context) -> Path:
        return experiment_out("privacy-report", ctx)

    def attacked(self, ctx: Context) -> list[tuple[str, str, str, list[str]]]:
        return robustness_runs(list(ctx.options.get("byzantine_reports", ("honest",)))) if ctx.options.get(
            "robustness") else []

    def plan(self, ctx: Context, out: Path) -> list[PlannedRun]:
        bad = [o for o in ctx.overrides if o.split("=", 1)[0].lstrip("+~") in ("algorithm", "attack", "run_dir")]
        if bad:
            raise ExperimentError(f"{bad}: algorithm, attack and run_dir are set by the report")
        planned = []
        for algo in ctx.options.get("algorithms", ("resfl", "fedavg")):
            planned.append(PlannedRun(algo, run_overrides(algo, "privacy", out / algo, ctx.overrides)))
            for attack, _, name, extra in self.attacked(ctx):
                planned.append(PlannedRun(f"{algo}-{name}", run_overrides(algo, attack, out / f"{algo}-{name}",
                                                                          [*ctx.overrides, *extra])))
        return planned

    def report(self, ctx: Context, runs: Runs) -> Report:
        report: dict[str, Any] = {"overrides": ctx.overrides, "runs": {}}
        for algo in ctx.options.get("algorithms", ("resfl", "fedavg")):
            run = runs.get(algo)
            entry: dict[str, Any] = {"run_dir": str(runs.dir(algo)), "wall_s": recorded_wall(runs.dir(algo)) or 0.0,
                                     "metrics": {} if run is None else run.summary}
            if ctx.options.get("robustness"):
                entry["robustness"] = {}
                for attack, key, name, _ in self.attacked(ctx):
                    attacked = runs.get(f"{algo}-{name}")
                    entry["wall_s"] += recorded_wall(runs.dir(f"{algo}-{name}")) or 0.0
                    if run is None or attacked is None:
                        entry["robustness"][key] = None
                        continue
                    cmp = compare_runs(run, attacked)
                    (attacked.path / "comparison.json").write_text(json.dumps(cmp, indent=2, sort_keys=True))
                    metric = "ba_ad" if attack == "byzantine" else key
                    entry["robustness"][key] = cmp["metrics"][metric]["value"]
                    entry["robustness"][f"{key}_detail"] = cmp["metrics"][metric]
            report["runs"][algo] = entry
        self.result = report
        return Report(markdown(report, ctx), "privacy.md",
                      files={"privacy_report.json": json.dumps(report, indent=2, sort_keys=True)})


def markdown(report: dict[str, Any], ctx: Context) -> str:
    """The printed table as markdown (privacy.md)."""
    algos = list(report["runs"])
    lines = [f"# Privacy under an honest-but-curious server: {', '.join(algos)} (overrides: "
             f"{' '.join(ctx.overrides) or 'none'})", "", "Lower SR / score = more private.", "",
             "| metric | " + " | ".join(algos) + " |", "| --- |" + " ---: |" * len(algos)]
    for label, keys in ROWS:
        keys = keys if isinstance(keys, tuple) else (keys,)
        lines.append(f"| {label} | " + " | ".join(" / ".join(_fmt(report["runs"][a]["metrics"].get(k)) for k in keys)
                                                  for a in algos) + " |")
    robust = {a: report["runs"][a].get("robustness", {}) for a in algos}
    if any(robust.values()):
        lines += [f"| {label} | " + " | ".join(_fmt(robust[a].get(key)) for a in algos) + " |"
                  for label, key in ROBUSTNESS_ROWS]
    return "\n".join(lines) + "\n"
