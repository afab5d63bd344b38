"""`make table`: every method x seed on one dataset and scenario, then the comparison table with intervals.

    python -m resfl_lightning.table --dataset adult [--methods fedavg,resfl] [--seeds 5] [--scenario iid]
                                    [--jobs 2] [--robustness] [--out DIR] [HYDRA_OVERRIDES ...]

Runs are resumable: a run whose summary.json exists is skipped, once its saved config is checked to be what its
command composes to now. `--jobs N` trains N runs at once (one process each, one thread per process); a run that
fails does not stop the others: the table is written once every run finished, and a re-invocation retries the
failed ones. Every method gets the same dataset, scenario, model, schedule, horizon and overrides; only its
`algorithm=` preset (and, for the label-free RESFL rows, the UFM cohort mode) differs. Writes DIR/table.md,
DIR/table.csv, DIR/pareto.png (and a W&B Table with --wandb).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from resfl_lightning.compare import compare_runs, load_run, run_privacy_score
from resfl_lightning.metrics.intervals import Interval, bootstrap_interval, paired_difference
from resfl_lightning.metrics.mechanism import run_mechanism
from resfl_lightning.resources import conf_dir
from resfl_lightning.run_settings import finished_run_mismatch

BASELINE = "fedavg"
# Method rows, fixed before any result was looked at: name -> overrides on top of the common ones.
METHODS: dict[str, list[str]] = {
    "fedavg": ["algorithm=fedavg"],
    "resfl": ["algorithm=resfl"],
    "resfl_af_cluster": ["algorithm=resfl", "ufm.cohorts=cluster"],
    "resfl_af_slices": ["algorithm=resfl", "ufm.cohorts=slices"],
    "fairfed": ["algorithm=fairfed"],
    "fedavg_dp": ["algorithm=fedavg_dp"],
    "puffle": ["algorithm=puffle"],
    "pfu_fl": ["algorithm=pfu_fl"],
    "privfairfl_pre": ["algorithm=privfairfl_pre"],
    "privfairfl_post": ["algorithm=privfairfl_post"],
    "curvfed": ["algorithm=curvfed"],
    "fedsam": ["algorithm=fedsam"],
    "fedswa": ["algorithm=fedswa"],
}
# Columns: (header, summary key or derived name, lower is better?)
COLUMNS = [
    ("utility", "utility", False),
    ("mAP@50", "test/map_50", False),
    ("|1-DI|", "test/abs_one_minus_di", True),
    ("ΔEOP", "test/delta_eop", True),
    ("EOD", "test/eod", True),
    ("Fairness Score", "score/fairness", True),
    ("MIA bal. acc.", "attack/mia_success_rate", True),
    ("MIA AUC", "attack/mia_auc", True),
    ("AIA bal. acc.", "attack/aia_balanced_accuracy", True),
    ("Privacy Score", "privacy_score", True),
    ("BA AD", "ba_ad", True),
    ("DPA EODD", "dpa_eodd", True),
    ("FATE vs FedAvg", "fate", False),
    ("wall s", "wall_s", True),
]


def available_methods() -> list[str]:
    """Methods whose algorithm preset exists in conf/algorithm/."""
    algo_dir = conf_dir() / "algorithm"
    return [m for m, ov in METHODS.items()
            if all((algo_dir / f"{o.split('=', 1)[1]}.yaml").is_file() for o in ov if o.startswith("algorithm="))]


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
    return [f"dataset={dataset}", f"scenario={scenario}", *table_preset(dataset), *METHODS[method], f"seed={seed}",
            f"attack={attack}", *([PRIVACY_ATTACKS] if attack == "privacy" else []), f"run_dir={run_dir}",
            "logger=none", "progress=false", *overrides]


def train_command(dataset: str, scenario: str, method: str, seed: int, run_dir: Path, attack: str,
                  overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "resfl_lightning.train",
            *train_overrides(dataset, scenario, method, seed, run_dir, attack, overrides)]


def is_finished(run_dir: Path) -> bool:
    return (run_dir / "summary.json").is_file() and (run_dir / "table_wall_s.json").is_file()


def stale_runs(jobs: list[tuple[str, int, str]], out: Path, args) -> list[str]:
    """Finished runs (which the table would skip) whose saved config differs from what their command composes to
    now: an older preset or other ARGS. One line each, naming the run and the first differing settings."""
    stale = []
    for m, s, a in jobs:
        rd = run_dir_for(out, m, s, a)
        if not is_finished(rd):
            continue
        diff = finished_run_mismatch(rd, train_overrides(args.dataset, args.scenario, m, s, rd, a,
                                                         list(args.overrides)))
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


def seed_metrics(out: Path, method: str, seed: int, robustness: bool) -> dict[str, float | None]:
    """Every table column for one finished (method, seed), the paired-with-FedAvg ones included."""
    run = load_run(run_dir_for(out, method, seed))
    s = run["summary"]

    def num(key):
        v = s.get(key)
        return float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else None

    row = {key: num(key) for _, key, _ in COLUMNS if "/" in key}
    row["utility"] = num("test/map") if num("test/map") is not None else num("test/accuracy")
    row["privacy_score"] = run_privacy_score(run)
    row["wall_s"] = float(json.loads((run_dir_for(out, method, seed) / "table_wall_s.json").read_text())["wall_s"])
    base = load_run(run_dir_for(out, BASELINE, seed))
    row["fate"] = compare_runs(base, run, fate_baseline=True)["metrics"]["fate"]["value"]
    if robustness:
        for attack, key in (("byzantine", "ba_ad"), ("poisoning", "dpa_eodd")):
            other = load_run(run_dir_for(out, method, seed, attack))
            row[key] = compare_runs(run, other)["metrics"][key]["value"]
    else:
        row["ba_ad"] = row["dpa_eodd"] = None
    return row


def summarise(per_seed: dict[str, dict[int, dict]]) -> dict[str, dict[str, tuple[Interval, Interval | None]]]:
    """method -> column -> (interval over seeds, interval of the paired difference to FedAvg or None)."""
    out = {}
    base = per_seed.get(BASELINE, {})
    for method, seeds in per_seed.items():
        cols = {}
        for _, key, _ in COLUMNS:
            values = {s: r[key] for s, r in seeds.items() if r.get(key) is not None}
            diff = None
            if method != BASELINE and key not in ("fate", "wall_s"):
                diff = paired_difference(values, {s: r[key] for s, r in base.items() if r.get(key) is not None})
            cols[key] = (bootstrap_interval(values.values()), diff)
        out[method] = cols
    return out


def write_outputs(out: Path, summary: dict, header: str) -> None:
    lines = [header, "",
             "mean ± std [95% bootstrap interval over seeds]; **bold**: the difference to FedAvg, paired by seed, "
             "has a 95% Student-t interval that excludes 0 (↓ lower is better, ↑ higher is better).", "",
             "| method | " + " | ".join(f"{h} {'↓' if low else '↑'}" for h, _, low in COLUMNS) + " |",
             "| --- |" + " ---: |" * len(COLUMNS)]
    rows = []
    for method, cols in summary.items():
        cells = []
        for _, key, _ in COLUMNS:
            iv, diff = cols[key]
            text = iv.fmt(1 if key == "wall_s" else 3)
            cells.append(f"**{text}**" if diff is not None and diff.excludes_zero else text)
            rows.append({"method": method, "metric": key, "mean": iv.mean, "std": iv.std, "ci_low": iv.low,
                         "ci_high": iv.high, "n_seeds": iv.n,
                         "diff_vs_fedavg": None if diff is None else diff.mean,
                         "diff_ci_low": None if diff is None else diff.low,
                         "diff_ci_high": None if diff is None else diff.high,
                         "diff_excludes_zero": None if diff is None else diff.excludes_zero})
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    lines += difference_lines(summary)
    (out / "table.md").write_text("\n".join(lines) + "\n")
    with (out / "table.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    from resfl_lightning.evaluation.pareto import plot_pareto

    plot_pareto(summary, out / "pareto.png", title=header.lstrip("# ").split(" (")[0])  # no timing in the figure


def difference_lines(summary: dict) -> list[str]:
    """The paired differences to FedAvg with their t-intervals, one row per method, bold where 0 is excluded."""
    keys = [(h, k) for h, k, _ in COLUMNS if k not in ("fate", "wall_s")]
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


# What UFM weighting had to act on (metrics/mechanism.py::run_mechanism), one row per method.
MECHANISM_COLUMNS = [
    ("UFM bootstrap SE", "ufm_se"),
    ("UFM spread across clients", "ufm_spread"),
    ("SE / spread", "se_over_spread"),
    ("rounds with UFM differing", "informative_rounds"),
    ("Spearman(UFM, val ΔEOP)", "spearman"),
    ("max client weight", "max_weight"),
    ("all-gated rounds", "gated_uniform_rounds"),
    ("weight of a quality-skewed client", "weight_skewed"),
    ("weight of a clean client", "weight_clean"),
]


def quality_skewed_clients(config: dict) -> list[int] | None:
    """The clients scenario=quality_skew degraded in a run (from its config, as report.load_run reads it), None for
    other scenarios or a run without a config."""
    from resfl_lightning.data.quality_skew import skewed_clients

    dataset = config.get("dataset") or {}
    qs = dataset.get("quality_skew")
    if not qs:
        return None
    return skewed_clients(int(dataset["num_clients"]), float(qs["client_fraction"]), int(config["seed"]))


def mechanism_lines(out: Path, methods: list[str], seeds: int) -> list[str]:
    """The mechanism table appended to table.md: medians / means over each run's rounds, then over seeds."""
    from resfl_lightning.report import load_run as load_rounds  # metrics.jsonl rows, errors naming file and line

    lines = ["", "What UFM weighting had to act on (per run over its rounds, then mean ± std over seeds): the clients' "
             "bootstrap SE of raw UFM against its spread (std) across clients, medians over the rounds in which raw "
             "UFM differed across clients (before the model detects anyone every client's UFM is 0), the mean "
             "per-round Spearman correlation of client UFM with client validation ΔEOP, the mean largest client "
             "weight (1/N = uniform), the rounds in which every client was gated and, under quality_skew, the mean "
             "weight of a degraded and of a clean client over the rounds in which raw UFM differed.", "",
             "| method | " + " | ".join(h for h, _ in MECHANISM_COLUMNS) + " |",
             "| --- |" + " ---: |" * len(MECHANISM_COLUMNS)]
    for method in methods:
        runs = [load_rounds(run_dir_for(out, method, seed)) for seed in range(seeds)]
        per_seed = [run_mechanism(r.rows, quality_skewed_clients(r.config)) for r in runs]
        cells = []
        for _, key in MECHANISM_COLUMNS:
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


def run_all(jobs: list[tuple[str, int, str]], out: Path, args, total: int) -> list[str]:
    """Train every (method, seed, attack) not finished yet, --jobs at a time; returns the failures' messages."""
    failures: list[str] = []
    done = 0

    def one(job):
        m, s, a = job
        rd = run_dir_for(out, m, s, a)
        return rd, run_one(train_command(args.dataset, args.scenario, m, s, rd, a, list(args.overrides)), rd)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
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


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m resfl_lightning.table", description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--scenario", default="iid")
    p.add_argument("--methods", default=None, help=f"comma-separated subset of {', '.join(METHODS)} (default: all "
                   "whose algorithm preset exists)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--robustness", action="store_true", help="also run attack=byzantine and attack=poisoning")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="runs trained at once, each one process (default: one per CPU core)")
    p.add_argument("--out", type=Path, default=None,
                   help="default runs/table-<dataset>-<scenario>[-<dataset.* overrides>]")
    p.add_argument("--wandb", action="store_true", help="also log the table as a W&B Table (offline)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    methods = available_methods() if args.methods is None else [m.strip() for m in args.methods.split(",")]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}")
    if BASELINE not in methods:
        methods = [BASELINE, *methods]  # every paired difference and FATE needs the FedAvg runs
    out = args.out or default_out(args.dataset, args.scenario, list(args.overrides))
    out.mkdir(parents=True, exist_ok=True)
    attacks = ["privacy", *(["byzantine", "poisoning"] if args.robustness else [])]
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {args.jobs}")
    t0 = time.perf_counter()
    jobs = [(m, s, a) for s in range(args.seeds) for m in methods for a in attacks]
    stale = stale_runs(jobs, out, args)
    if stale:
        raise SystemExit(f"{len(stale)} finished runs in {out} were trained with other settings than this command "
                         "gives them (older table preset or other ARGS); a table mixing them would compare unlike "
                         "runs. Move them away or pass --out DIR:\n" + "\n".join(stale))
    failures = run_all(jobs, out, args, len(jobs))
    if failures:
        raise SystemExit(f"{len(failures)} of {len(jobs)} runs failed (re-run the same command to retry them):\n"
                         + "\n".join(failures))
    per_seed = {m: {s: seed_metrics(out, m, s, args.robustness) for s in range(args.seeds)} for m in methods}
    total = time.perf_counter() - t0
    run_walls = sum(json.loads((run_dir_for(out, m, s, a) / "table_wall_s.json").read_text())["wall_s"]
                    for m, s, a in jobs)
    header = (f"# {args.dataset}, scenario {args.scenario}: {len(methods)} methods x {args.seeds} seeds "
              f"({len(jobs)} runs; this invocation took {total:.0f} s with --jobs {args.jobs}; the runs' own wall "
              f"times sum to {run_walls:.0f} s)")
    write_outputs(out, summarise(per_seed), header)
    with (out / "table.md").open("a") as fh:
        fh.write("\n".join(mechanism_lines(out, methods, args.seeds)) + "\n")
    if args.wandb:
        log_wandb_table(out, project="resfl-lightning")
    print((out / "table.md").read_text())
    print(f"table written to {out} in {total:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
