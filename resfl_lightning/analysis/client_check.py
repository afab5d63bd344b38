"""`resfl robustness --subset S --check-clients`: the check behind a subset's number of clients (a subset's
`client_check` in conf/table/robustness.yaml; the detection subset's rule is docs/robustness-protocol.md's amendment
of 2026-11-28). FedAvg's clean run of the grid at each n on a tuning seed outside the grid's seeds; the subset runs
at the `candidate` n if its utility reaches `min_ratio` x the `reference` n's, else at the `fallback` n. The results
file records the runs, the rule's outcome, and whether the subset's `clients` agrees with it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from resfl_lightning.analysis.experiment import ExperimentError, raise_failures, refuse_stale
from resfl_lightning.analysis.finished_run import finished_run
from resfl_lightning.analysis.robustness import CLEAN, Cell, load_grid, select, train_overrides
from resfl_lightning.analysis.run_records import summed_wall
from resfl_lightning.analysis.runner import run_jobs

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


def make_client_check(dataset: str, scenario: str, subset: str, jobs: int, out: Path, overrides: list[str],
                      results_path: Path | None, command: str) -> tuple[Path, Outcome, int]:
    """Train the check's missing runs, write DIR/client_check.md (and the results file with its provenance);
    returns (DIR, the outcome, the subset's configured n)."""
    from resfl_lightning.analysis.provenance import write_results

    grid = load_grid()
    rule = check_rule(grid, subset)
    configured = select(grid, subset)["clients"]
    seed = int(rule["seed"])
    out.mkdir(parents=True, exist_ok=True)
    jobs_list = []
    for n in rule["clients"]:
        run_dir = out / f"{CHECKED.name}-n{n}-s{seed}"
        jobs_list.append((run_dir, train_overrides(dataset, scenario, {**grid, "clients": int(n)}, CHECKED, seed,
                                                   out, overrides, run_dir=run_dir)))
    t0 = time.perf_counter()
    refuse_stale(jobs_list, out)
    failures = run_jobs(jobs_list, jobs)
    rows = {}
    for n, (run_dir, _) in zip(rule["clients"], jobs_list):
        run = finished_run(run_dir)
        rows[n] = {k: None if run is None else run.value(k) for k in (rule["metric"], "test/map")}
    outcome = decide_clients({n: v[rule["metric"]] for n, v in rows.items()}, rule)
    total = time.perf_counter() - t0
    walls = summed_wall(rd for rd, _ in jobs_list)
    title = (f"# Client-count check of the robustness subset {subset!r}, {dataset}, scenario {scenario} "
             f"({len(jobs_list)} runs; this invocation took {total:.0f} s with --jobs {jobs}; the runs' own wall "
             f"times sum to {walls:.0f} s)")
    body = markdown(title, rule, rows, outcome, configured)
    (out / "client_check.md").write_text(body)
    if results_path is not None:
        write_results(results_path, body, command, wall_s=total, runs_wall_s=walls, writer="resfl robustness")
    raise_failures(failures, len(jobs_list), out)
    return out, outcome, configured
