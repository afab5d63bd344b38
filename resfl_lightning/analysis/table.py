"""`resfl table` (`make table`): every method x seed on one dataset and scenario, then the comparison table with
intervals. The methods are the presets of conf/algorithm/ (each sets its row position, `table_order`), the columns
come from conf/table/columns.yaml (columns.py).

Runs are resumable: a run whose summary.json exists is skipped, once its saved config is checked to be what its
command composes to now. `--jobs N` trains N runs at once (one process each, one thread per process); a run that
fails does not stop the others: the table is written once every run finished, and a re-invocation retries the
failed ones. Every method gets the same dataset, scenario, model, schedule, horizon and overrides; only its
`algorithm=` preset differs. Writes DIR/table.md, DIR/table.csv, DIR/pareto.png (a W&B Table with --wandb, and a
results file with its provenance with --results).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from resfl_lightning.analysis.columns import Column, SeedRuns, load_columns, load_mechanism_columns
from resfl_lightning.analysis.run_settings import finished_run_mismatch
from resfl_lightning.metrics.intervals import Interval, bootstrap_interval, paired_difference
from resfl_lightning.metrics.mechanism import run_mechanism
from resfl_lightning.resources import conf_dir

BASELINE = "fedavg"  # every paired difference and FATE is taken against this method's run of the same seed


class TableError(RuntimeError):
    """The table cannot be made as asked (unknown method, stale or failed runs); the message says why."""


def algorithm_presets() -> list[str]:
    """Every preset of conf/algorithm/, ordered by the `table_order` its own file sets (a row position fixed before
    any result was looked at; inherited values do not count, so two presets cannot share a row by accident)."""
    order: dict[str, int] = {}
    for path in sorted((conf_dir() / "algorithm").glob("*.yaml")):
        raw = OmegaConf.load(path)
        value = raw.table_order if "table_order" in raw else None
        if not isinstance(value, int) or isinstance(value, bool):
            raise TableError(f"{path}: table_order: every algorithm preset sets its own row position in the "
                             f"comparison table (an integer), got {value!r}")
        order[path.stem] = value
    by_position: dict[int, list[str]] = {}
    for name, value in order.items():
        by_position.setdefault(value, []).append(name)
    shared = {v: names for v, names in by_position.items() if len(names) > 1}
    if shared:
        raise TableError(f"{conf_dir() / 'algorithm'}: table_order: presets share a row position: {shared}")
    return sorted(order, key=lambda name: order[name])


def method_overrides(method: str) -> list[str]:
    return [f"algorithm={method}"]


def run_dir_for(out: Path, method: str, seed: int, attack: str = "privacy") -> Path:
    return out / (f"{method}-s{seed}" if attack == "privacy" else f"{method}-s{seed}-{attack}")


# The privacy runs attack what the table reports: MIA, representation AIA (the Privacy Score's two halves) and EOD.
# The update-aware AIA is left out: it is no column here, and under group skew it trains 6 shadow clients a round.
PRIVACY_ATTACKS = "attack.enabled=[mia,aia,eod]"


def table_preset(dataset: str) -> list[str]:
    """`experiment=table_<dataset>` when conf/experiment/ has it: the size the table trains that dataset at."""
    return [f"experiment=table_{dataset}"] if (conf_dir() / "experiment" / f"table_{dataset}.yaml").is_file() else []


def train_overrides(dataset: str, scenario: str, method: str, seed: int, run_dir: Path, attack: str,
                    overrides: list[str]) -> list[str]:
    """The Hydra overrides of one table run: the common ones, the method's, then the user's (which win)."""
    return [f"dataset={dataset}", f"scenario={scenario}", *table_preset(dataset), *method_overrides(method),
            f"seed={seed}", f"attack={attack}", *([PRIVACY_ATTACKS] if attack == "privacy" else []),
            f"run_dir={run_dir}", "logger=none", "progress=false", *overrides]


def train_command(dataset: str, scenario: str, method: str, seed: int, run_dir: Path, attack: str,
                  overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "resfl_lightning.train",
            *train_overrides(dataset, scenario, method, seed, run_dir, attack, overrides)]


def is_finished(run_dir: Path) -> bool:
    return (run_dir / "summary.json").is_file() and (run_dir / "table_wall_s.json").is_file()


def stale_runs(jobs: list[tuple[str, int, str]], out: Path, dataset: str, scenario: str,
               overrides: list[str]) -> list[str]:
    """Finished runs (which the table would skip) whose saved config differs from what their command composes to
    now: an older preset or other ARGS. One line each, naming the run and the first differing settings."""
    stale = []
    for m, s, a in jobs:
        rd = run_dir_for(out, m, s, a)
        if not is_finished(rd):
            continue
        diff = finished_run_mismatch(rd, train_overrides(dataset, scenario, m, s, rd, a, overrides))
        if diff:
            more = f" (and {len(diff) - 4} more)" if len(diff) > 4 else ""
            stale.append(f"{rd}: " + "; ".join(diff[:4]) + more)
    return stale


def run_one(cmd: list[str], run_dir: Path) -> float:
    """Train one run unless it already finished; returns its wall time (stored beside the run)."""
    timing = run_dir / "table_wall_s.json"
    if is_finished(run_dir):
        return float(json.loads(timing.read_text())["wall_s"])
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with (run_dir / "table_train.log").open("w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"run {run_dir} failed ({proc.returncode}); see {run_dir / 'table_train.log'}")
    timing.write_text(json.dumps({"wall_s": wall, "command": cmd}))
    return wall


def seed_metrics(out: Path, method: str, seed: int, columns: list[Column],
                 attacks: list[str]) -> dict[str, float | None]:
    """Every table column for one finished (method, seed), the paired-with-FedAvg ones included."""
    runs = SeedRuns(run_dir=run_dir_for(out, method, seed), baseline_dir=run_dir_for(out, BASELINE, seed),
                    attacked={a: run_dir_for(out, method, seed, a) for a in attacks if a != "privacy"})
    return {c.key: c.value(runs) for c in columns}


def summarise(per_seed: dict[str, dict[int, dict]],
              columns: list[Column]) -> dict[str, dict[str, tuple[Interval, Interval | None]]]:
    """method -> column -> (interval over seeds, interval of the paired difference to FedAvg or None)."""
    out = {}
    base = per_seed[BASELINE] if BASELINE in per_seed else {}
    for method, seeds in per_seed.items():
        cols = {}
        for c in columns:
            values = {s: r[c.key] for s, r in seeds.items() if r[c.key] is not None}
            diff = None
            if method != BASELINE and c.paired:
                diff = paired_difference(values, {s: r[c.key] for s, r in base.items() if r[c.key] is not None})
            cols[c.key] = (bootstrap_interval(values.values()), diff)
        out[method] = cols
    return out


def write_outputs(out: Path, summary: dict, header: str, columns: list[Column]) -> None:
    lines = [header, "",
             "mean ± std [95% bootstrap interval over seeds]; **bold**: the difference to FedAvg, paired by seed, "
             "has a 95% Student-t interval that excludes 0 (↓ lower is better, ↑ higher is better).", "",
             "| method | " + " | ".join(f"{c.header} {'↓' if c.lower_is_better else '↑'}" for c in columns) + " |",
             "| --- |" + " ---: |" * len(columns)]
    rows = []
    for method, cols in summary.items():
        cells = []
        for c in columns:
            iv, diff = cols[c.key]
            text = iv.fmt(c.decimals)
            cells.append(f"**{text}**" if diff is not None and diff.excludes_zero else text)
            rows.append({"method": method, "metric": c.key, "mean": iv.mean, "std": iv.std, "ci_low": iv.low,
                         "ci_high": iv.high, "n_seeds": iv.n,
                         "diff_vs_fedavg": None if diff is None else diff.mean,
                         "diff_ci_low": None if diff is None else diff.low,
                         "diff_ci_high": None if diff is None else diff.high,
                         "diff_excludes_zero": None if diff is None else diff.excludes_zero})
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += difference_lines(summary, columns)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    with (out / "table.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    from resfl_lightning.evaluation.pareto import plot_pareto

    plot_pareto(summary, out / "pareto.png", title=header.lstrip("# ").split(" (")[0])  # no timing in the figure


def difference_lines(summary: dict, columns: list[Column]) -> list[str]:
    """The paired differences to FedAvg with their t-intervals, one row per method, bold where 0 is excluded."""
    keys = [(c.header, c.key) for c in columns if c.paired]
    lines = ["", "Difference to FedAvg, paired by seed: mean [95% Student-t interval over seeds].", "",
             "| method − FedAvg | " + " | ".join(h for h, _ in keys) + " |", "| --- |" + " ---: |" * len(keys)]
    for method, cols in summary.items():
        if method == BASELINE:
            continue
        cells = []
        for _, key in keys:
            diff = cols[key][1]
            text = "n/a" if diff is None or diff.n < 2 else f"{diff.mean:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}]"
            cells.append(f"**{text}**" if diff is not None and diff.excludes_zero else text)
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def quality_skewed_clients(config: dict) -> list[int] | None:
    """The clients scenario=quality_skew degraded in a run (from its config, as report.load_run reads it), None for
    other scenarios or a run without a config."""
    from resfl_lightning.data.quality_skew import skewed_clients

    dataset = config["dataset"] if "dataset" in config else {}
    qs = dataset["quality_skew"] if "quality_skew" in dataset else None
    if not qs:
        return None
    return skewed_clients(int(dataset["num_clients"]), float(qs["client_fraction"]), int(config["seed"]))


def mechanism_lines(out: Path, methods: list[str], seeds: int) -> list[str]:
    """The mechanism table appended to table.md: medians / means over each run's rounds, then over seeds."""
    from resfl_lightning.analysis.report import load_run as load_rounds  # metrics.jsonl rows, errors naming file, line

    mechanism_columns = load_mechanism_columns()

    lines = ["", "What UFM weighting had to act on (per run over its rounds, then mean ± std over seeds): the clients' "
             "bootstrap SE of raw UFM against its spread (std) across clients, medians over the rounds in which raw "
             "UFM differed across clients (before the model detects anyone every client's UFM is 0), the mean "
             "per-round Spearman correlation of client UFM with client validation ΔEOP, the mean largest client "
             "weight (1/N = uniform), the rounds in which every client was gated and, under quality_skew, the mean "
             "weight of a degraded and of a clean client over the rounds in which raw UFM differed.", "",
             "| method | " + " | ".join(h for h, _ in mechanism_columns) + " |",
             "| --- |" + " ---: |" * len(mechanism_columns)]
    for method in methods:
        runs = [load_rounds(run_dir_for(out, method, seed)) for seed in range(seeds)]
        per_seed = [run_mechanism(r.rows, quality_skewed_clients(r.config)) for r in runs]
        cells = []
        for _, key in mechanism_columns:
            x = np.array([m[key] for m in per_seed], dtype=float)
            x = x[~np.isnan(x)]
            cells.append("n/a" if x.size == 0 else f"{x.mean():.3f} ± {x.std(ddof=1):.3f}" if x.size > 1
                         else f"{x.mean():.3f}")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def log_wandb_table(out: Path, project: str) -> None:
    import wandb

    with (out / "table.csv").open() as fh:
        data = list(csv.reader(fh))
    run = wandb.init(project=project, name=out.name, dir=str(out), mode="offline", reinit=True)
    run.log({"comparison": wandb.Table(columns=data[0], data=data[1:])})
    run.finish()


def default_out(dataset: str, scenario: str, overrides: list[str]) -> Path:
    """runs/table-<dataset>-<scenario>, plus the dataset.* overrides (Adult's race and sex tables stay apart)."""
    tags = [o.split("=", 1)[1] for o in overrides
            if o.startswith("dataset.") and "=" in o and not o.startswith("dataset.root=")]
    return Path("runs") / "-".join(["table", dataset, scenario, *tags])


def run_all(jobs: list[tuple[str, int, str]], out: Path, dataset: str, scenario: str, overrides: list[str],
            workers: int) -> list[str]:
    """Train every (method, seed, attack) not finished yet, `workers` at a time; returns the failures' messages."""
    failures: list[str] = []
    done = 0

    def one(job):
        m, s, a = job
        rd = run_dir_for(out, m, s, a)
        return rd, run_one(train_command(dataset, scenario, m, s, rd, a, overrides), rd)

    total = len(jobs)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, job) for job in jobs]
        for fut in futures:
            done += 1
            try:
                rd, wall = fut.result()
                print(f"[{done}/{total}] {rd.name}: {wall:.0f} s", flush=True)
            except RuntimeError as err:  # one failed run never ends the table
                failures.append(str(err))
                print(f"[{done}/{total}] FAILED: {err}", flush=True)
    return failures


def make_table(dataset: str, scenario: str, methods: list[str] | None, seeds: int, robustness: bool, jobs: int,
               out: Path | None, overrides: list[str], wandb: bool = False, results: Path | None = None,
               command: str = "resfl table") -> Path:
    """Train what is missing, write DIR/table.md, table.csv, pareto.png (and the results file); returns DIR."""
    from resfl_lightning.analysis.provenance import write_results

    presets = algorithm_presets()
    methods = presets if methods is None else methods
    unknown = [m for m in methods if m not in presets]
    if unknown:
        raise TableError(f"--methods: unknown {unknown}; choose from {', '.join(presets)}")
    if BASELINE not in methods:
        methods = [BASELINE, *methods]  # every paired difference and FATE needs the FedAvg runs
    if jobs < 1:
        raise TableError(f"--jobs must be >= 1, got {jobs}")
    columns = load_columns()
    out = out or default_out(dataset, scenario, overrides)
    out.mkdir(parents=True, exist_ok=True)
    attacks = ["privacy", *(dict.fromkeys(a for c in columns for a in c.attacks()) if robustness else ())]
    t0 = time.perf_counter()
    runs = [(m, s, a) for s in range(seeds) for m in methods for a in attacks]
    stale = stale_runs(runs, out, dataset, scenario, overrides)
    if stale:
        raise TableError(f"{len(stale)} finished runs in {out} were trained with other settings than this command "
                         "gives them (older table preset or other ARGS); a table mixing them would compare unlike "
                         "runs. Move them away or pass --out DIR:\n" + "\n".join(stale))
    failures = run_all(runs, out, dataset, scenario, overrides, jobs)
    if failures:
        raise TableError(f"{len(failures)} of {len(runs)} runs failed (re-run the same command to retry them):\n"
                         + "\n".join(failures))
    per_seed = {m: {s: seed_metrics(out, m, s, columns, attacks) for s in range(seeds)} for m in methods}
    total = time.perf_counter() - t0
    run_walls = sum(json.loads((run_dir_for(out, m, s, a) / "table_wall_s.json").read_text())["wall_s"]
                    for m, s, a in runs)
    header = (f"# {dataset}, scenario {scenario}: {len(methods)} methods x {seeds} seeds "
              f"({len(runs)} runs; this invocation took {total:.0f} s with --jobs {jobs}; the runs' own wall "
              f"times sum to {run_walls:.0f} s)")
    write_outputs(out, summarise(per_seed, columns), header, columns)
    with (out / "table.md").open("a") as fh:
        fh.write("\n".join(mechanism_lines(out, methods, seeds)) + "\n")
    if wandb:
        log_wandb_table(out, project="resfl-lightning")
    if results is not None:
        write_results(results, (out / "table.md").read_text(), command, wall_s=total, runs_wall_s=run_walls)
    return out
