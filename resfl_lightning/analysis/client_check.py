"""`resfl robustness --subset S --check-clients`: the check behind a subset's number of clients (a subset's
`client_check` in conf/table/robustness.yaml; the detection subset's rule is docs/robustness-protocol.md's amendment
of 2026-11-28). FedAvg's clean run of the grid at each n on a tuning seed outside the grid's seeds; the subset runs
at the `candidate` n if its utility reaches `min_ratio` x the `reference` n's, else at the `fallback` n. The results
file records the runs, the rule's outcome, and whether the subset's `clients` agrees with it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from resfl_lightning.analysis.execute import Context, Experiment, PlannedRun, Report, Runs, experiment_out
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.robustness_grid import CLEAN, Cell, load_grid, runs_kind, select, train_overrides

CHECKED = Cell("fedavg", CLEAN, "honest", 0.0)  # the rule reads FedAvg's clean run


@dataclass(frozen=True)
class Outcome:
    clients: int | None  # None: not decidable (a run the rule reads has no value)
    text: str


def check_rule(grid: dict, subset: str) -> dict:
    """The subset's client_check, with its keys checked (the message names the missing one)."""
    rule = grid.get("subsets", {}).get(subset, {}).get("client_check")
    if rule is None:
        raise ExperimentError(f"--check-clients: subset {subset!r} has no client_check in conf/table/robustness.yaml")
    missing = [k for k in ("seed", "clients", "metric", "reference", "candidate", "fallback", "min_ratio")
               if k not in rule]
    if missing:
        raise ExperimentError(f"subset {subset!r}: client_check lacks {missing} (conf/table/robustness.yaml)")
    if not str(rule["metric"]).startswith("val/"):  # selection reads validation only (docs/method.md)
        raise ExperimentError(f"subset {subset!r}: client_check metric {rule['metric']!r} is not a validation key "
                              f"(val/*): a selection never reads the test split")
    for key in ("reference", "candidate", "fallback"):
        if rule[key] not in rule["clients"]:
            raise ExperimentError(f"subset {subset!r}: client_check {key} {rule[key]} is not among clients "
                                  f"{rule['clients']}")
    return rule


def decide_clients(values: dict[int, float | None], rule: dict) -> Outcome:
    """The n the rule picks from {n: utility of FedAvg's clean run at n}."""
    ref, cand = values.get(rule["reference"]), values.get(rule["candidate"])
    if ref is None or cand is None:
        return Outcome(None, f"not decidable: no {rule['metric']} at n = "
                             f"{rule['reference'] if ref is None else rule['candidate']}")
    bar = rule["min_ratio"] * ref
    if cand >= bar:
        return Outcome(rule["candidate"], f"{cand:.4g} >= {rule['min_ratio']} x {ref:.4g} = {bar:.4g} at n = "
                                          f"{rule['candidate']}: the subset runs at n = {rule['candidate']}")
    return Outcome(rule["fallback"], f"{cand:.4g} < {rule['min_ratio']} x {ref:.4g} = {bar:.4g} at n = "
                                     f"{rule['candidate']}: the subset runs at n = {rule['fallback']}")


def markdown(title: str, rule: dict, rows: dict[int, dict[str, float | None]], outcome: Outcome,
             configured: int) -> str:
    def num(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.4g}"

    ref = rows.get(rule["reference"], {}).get(rule["metric"])
    lines = [title, "",
             f"FedAvg's clean run of the grid at each number of clients n, seed {rule['seed']} (a tuning seed outside "
             f"the grid's). Rule (conf/table/robustness.yaml, fixed before the check first ran): "
             f"n = {rule['candidate']} if its {rule['metric']} >= "
             f"{rule['min_ratio']} x the n = {rule['reference']} run's, else n = {rule['fallback']}.", "",
             f"| n | {rule['metric']} | test/map (mAP@50-95) | ratio to n = {rule['reference']} |",
             "| ---: | ---: | ---: | ---: |"]
    for n in rule["clients"]:
        v = rows.get(n, {})
        m = v.get(rule["metric"])
        ratio = "n/a" if m is None or not ref else f"{m / ref:.3f}"
        lines.append(f"| {n} | {num(m)} | {num(v.get('test/map'))} | {ratio} |")
    agrees = outcome.clients is not None and outcome.clients == configured
    verdict = ("agrees" if agrees else "not decidable" if outcome.clients is None
               else f"DISAGREES (the rule picks {outcome.clients})")
    lines += ["", f"- outcome: {outcome.text}",
              f"- conf/table/robustness.yaml runs the subset at clients: {configured}: **{verdict}**"]
    return "\n".join(lines) + "\n"


class ClientCheck(Experiment):
    """`resfl robustness --subset S --check-clients`: FedAvg's clean run at each n of the subset's client_check
    (ctx.options: `subset`), then client_check.md with the rule's outcome (Report.files is empty; the outcome and
    the subset's configured n are on the instance after report, for the command's exit code)."""

    writer = "resfl robustness"

    def __init__(self, grid_path=None):
        super().__init__(grid_path)
        self.outcome: Outcome | None = None
        self.configured: int | None = None

    def rule(self, ctx: Context) -> tuple[dict, dict]:
        grid = load_grid(self.grid_path)
        return grid, check_rule(grid, ctx.options["subset"])

    def default_out(self, ctx: Context) -> Path:
        return experiment_out(runs_kind(self.grid_path), ctx, ctx.options["subset"], "client-check")

    def plan(self, ctx: Context, out: Path) -> list[PlannedRun]:
        grid, rule = self.rule(ctx)
        seed = int(rule["seed"])
        planned = []  # eval.final_validation: the final model evaluated on the validation splits, the rule's val/*
        for n in rule["clients"]:
            run_dir = out / f"{CHECKED.name}-n{n}-s{seed}"
            planned.append(PlannedRun(run_dir.name, train_overrides(ctx.dataset, ctx.scenario,
                                                                    {**grid, "clients": int(n)}, CHECKED, seed, out,
                                                                    ["eval.final_validation=true", *ctx.overrides],
                                                                    run_dir=run_dir)))
        return planned

    def report(self, ctx: Context, runs: Runs) -> Report:
        grid, rule = self.rule(ctx)
        subset = ctx.options["subset"]
        self.configured = select(grid, subset)["clients"]
        rows = {}
        for n, planned in zip(rule["clients"], runs.planned):
            run = runs.get(planned.name)
            rows[n] = {k: None if run is None else run.value(k) for k in (rule["metric"], "test/map")}
        self.outcome = decide_clients({n: v[rule["metric"]] for n, v in rows.items()}, rule)
        title = (f"# Client-count check of the robustness subset {subset!r}, {ctx.dataset}, scenario {ctx.scenario} "
                 f"({len(runs.planned)} runs; this invocation took {runs.elapsed_s:.0f} s with --jobs {ctx.jobs}; "
                 f"the runs' own wall times sum to {runs.runs_wall_s:.0f} s)")
        return Report(markdown(title, rule, rows, self.outcome, self.configured), "client_check.md")
