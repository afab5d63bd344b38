"""`resfl table` (`make table`): every method x seed on one dataset and scenario, then the comparison table with
intervals. The methods are the presets of conf/algorithm/ (each sets its row position, `table_order`), the columns
come from conf/table/columns.yaml (columns.py).

Runs are resumable: a run whose summary.json exists is skipped, once its saved config is checked to be what its
command composes to now. `--jobs N` trains N runs at once (one process each, forked from a process that imported
the libraries once: analysis/runner.py; one thread per process); a run that fails does not stop the others: the
table is written once every run finished, showing the failed runs as failed, and a re-invocation retries them.
The statistics (common seeds, utility floor, Student-t intervals, Holm / BH, power, FATE, verdicts) are in
analysis/statistics.py with their settings in conf/table/statistics.yaml and claims.yaml. Every method gets the same
dataset, scenario, model, schedule, horizon and overrides; only its `algorithm=` preset differs. Writes
DIR/table.md, DIR/table.csv, DIR/pareto.png (a W&B Table with --wandb, and a results file with its provenance with
--results).
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.analysis.client_leakage_section import client_leakage_lines
from resfl_lightning.analysis.columns import Column, Fate, SeedRuns, load_columns, load_mechanism_columns
from resfl_lightning.analysis.dp_accounting import dp_accounting_lines
from resfl_lightning.analysis.execute import Context, Experiment, PlannedRun, Report, Runs, experiment_out
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.statistics import (
    Cell,
    Claim,
    SeedRecord,
    StatisticsSettings,
    failed_record,
    family_sizes,
    load_claims,
    load_statistics,
    power_lines,
    summarise,
    verdict_lines,
)
from resfl_lightning.metrics.intervals import Interval, interval_text, mean_sd_text
from resfl_lightning.metrics.mechanism import run_mechanism
from resfl_lightning.metrics.statistics import below_utility_floor, no_positive_at_threshold
from resfl_lightning.resources import conf_dir

BASELINE = "fedavg"  # every paired difference and FATE is taken against this method's run of the same seed


def algorithm_presets() -> list[str]:
    """Every preset of conf/algorithm/, ordered by the `table_order` its own file sets (a row position fixed before
    any result was looked at; inherited values do not count, so two presets cannot share a row by accident)."""
    order: dict[str, int] = {}
    for path in sorted((conf_dir() / "algorithm").glob("*.yaml")):
        raw = OmegaConf.load(path)
        value = raw.table_order if "table_order" in raw else None
        if not isinstance(value, int) or isinstance(value, bool):
            raise ExperimentError(f"{path}: table_order: every algorithm preset sets its own row position in the "
                             f"comparison table (an integer), got {value!r}")
        order[path.stem] = value
    by_position: dict[int, list[str]] = {}
    for name, value in order.items():
        by_position.setdefault(value, []).append(name)
    shared = {v: names for v, names in by_position.items() if len(names) > 1}
    if shared:
        raise ExperimentError(f"{conf_dir() / 'algorithm'}: table_order: presets share a row position: {shared}")
    return sorted(order, key=lambda name: order[name])


def method_overrides(method: str) -> list[str]:
    return [f"algorithm={method}"]


def run_dir_for(out: Path, method: str, seed: int, attack: str = "privacy") -> Path:
    return out / (f"{method}-s{seed}" if attack == "privacy" else f"{method}-s{seed}-{attack}")


# The privacy runs attack what the table reports: MIA, representation AIA (the Privacy Score's two halves) and EOD.
# The update-aware AIA is left out: it is no column here, and under group skew it trains 6 shadow clients a round.
PRIVACY_ATTACKS = "attack.enabled=[mia,aia,eod]"
# With --audit, one more run per method and seed: the membership audit with reference models (RMIA, K = 4, a = 0.3
# as docs/method.md §7 recommends, each client's leakage), read by the columns with `option: audit`.
ATTACK_OVERRIDES = {
    "privacy": ["attack=privacy", PRIVACY_ATTACKS],
    "audit": ["attack=privacy", "attack.enabled=[mia]", "attack.mia.method=rmia", "attack.mia.rmia_offline_a=0.3",
              "attack.mia.per_client=true"],
}
# With --audit-in-run, the privacy run carries that audit beside its shadow attack (attack/mia_audit_*): its target
# model is the one the audit run would train again, and its references the same (attacks/references.py).
AUDIT_IN_RUN = ["attack.mia.audit=rmia", "attack.mia.rmia_offline_a=0.3", "attack.mia.per_client=true"]


def table_preset(dataset: str, overrides: list[str] = ()) -> list[str]:
    """`experiment=table_<dataset>` when conf/experiment/ has it (the size the table trains that dataset at), unless
    the user's overrides choose an experiment themselves (e.g. experiment=table_synthetic_v1, a retired preset)."""
    if any(o.startswith("experiment=") for o in overrides):
        return []
    return [f"experiment=table_{dataset}"] if (conf_dir() / "experiment" / f"table_{dataset}.yaml").is_file() else []


def train_overrides(dataset: str, scenario: str, method: str, seed: int, run_dir: Path, attack: str,
                    overrides: list[str], audit_in_run: bool = False) -> list[str]:
    """The Hydra overrides of one table run: the common ones, the method's, then the user's (which win)."""
    audit = AUDIT_IN_RUN if audit_in_run and attack == "privacy" else []
    return [f"dataset={dataset}", f"scenario={scenario}", *table_preset(dataset, overrides), *method_overrides(method),
            f"seed={seed}", *ATTACK_OVERRIDES.get(attack, [f"attack={attack}"]), *audit,
            f"run_dir={run_dir}", "logger=none", "progress=false", *overrides]


def table_attacks(columns: list[Column], options: dict) -> list[str]:
    """The runs of one (method, seed): the privacy run, then the attacked runs the columns of the chosen options
    (--robustness, --audit) read; with --audit-in-run the audit has none (the privacy run carries it)."""
    extra = (a for c in columns for a in c.attacks() if options.get(c.option))
    return ["privacy", *dict.fromkeys(a for a in extra if not (a == "audit" and options.get("audit_in_run")))]


def seed_runs(out: Path, method: str, seed: int, attacks: list[str]) -> SeedRuns:
    """The run directories of one (method, seed); attacked runs only when they finished."""
    attacked = {a: run_dir_for(out, method, seed, a) for a in attacks if a != "privacy"}
    return SeedRuns(run_dir=run_dir_for(out, method, seed), baseline_dir=run_dir_for(out, BASELINE, seed),
                    attacked={a: d for a, d in attacked.items() if (d / "summary.json").is_file()})


def seed_metrics(out: Path, method: str, seed: int, columns: list[Column],
                 attacks: list[str]) -> dict[str, float | None]:
    """Every table column for one finished (method, seed)."""
    runs = seed_runs(out, method, seed, attacks)
    return {c.key: c.value(runs) for c in columns}


def seed_record(out: Path, method: str, seed: int, columns: list[Column], attacks: list[str],
                settings: StatisticsSettings) -> SeedRecord:
    """One (method, seed) for the table: each column's value or why it has none, the utility floor, FATE's inputs;
    a run without summary.json is a failed run (its failure is shown, never averaged away)."""
    rd = run_dir_for(out, method, seed)
    if not (rd / "summary.json").is_file():
        return failed_record(f"{rd.name} did not finish (see {rd / 'table_train.log'})")
    runs = seed_runs(out, method, seed, attacks)
    record = SeedRecord()
    for c in columns:
        record.values[c.key] = c.value(runs)
        if record.values[c.key] is None:
            record.reasons[c.key] = c.why_missing(runs)
        if isinstance(c, Fate):
            record.fate_inputs = c.inputs(runs)
    summary = runs.run.summary
    record.floor = below_utility_floor(summary, settings.map50_floor)
    record.no_positive = no_positive_at_threshold(summary)
    record.aia_fallback = summary.get("attack/aia_gt_box_fallback") == 1.0
    record.groups_excluded = dict(summary.get("test/groups_excluded") or {})
    return record


def _interval_text(iv: Interval, decimals: int, planned: int) -> str:
    text = iv.fmt(decimals)
    return text if iv.n >= planned else f"{text} (n={iv.n}/{planned})"


def cell_text(cell: Cell, column: Column) -> str:
    """A cell of the main table: mean ± std [95 % t-interval], n when below the seeds run, n/a with its reason,
    (values) of runs below the utility floor, bold when the paired difference survives its correction."""
    if isinstance(column, Fate):
        return fate_text(cell)
    if cell.interval.n == 0:
        if cell.greyed is not None:
            return f"({cell.greyed.fmt(column.decimals)}) {cell.greyed_why}"
        if cell.failed == cell.planned:
            return "failed"
        return f"n/a ({cell.reason or 'no value'})"
    text = _interval_text(cell.interval, column.decimals, cell.planned)
    return f"**{text}**" if cell.survives else text


def fate_text(cell: Cell) -> str:
    fate = cell.fate
    if fate is None:
        return "—"  # the baseline against itself
    if fate.n == 0:
        also = "" if cell.greyed_why == "did not learn" else " and detected something"
        return f"n/a (no common seed where both runs learned{also})"
    if math.isnan(fate.value):
        return "n/a (the baseline's mean EO or utility is 0)"
    if fate.n < 2:
        return f"{fate.value:+.3f} (n=1)"
    text = f"{fate.value:+.3f} [{fate.low:+.3f}, {fate.high:+.3f}]"
    return text if fate.n >= cell.planned else f"{text} (n={fate.n}/{cell.planned})"


def difference_text(cell: Cell) -> str:
    """A paired difference to the baseline: mean [95 % t-interval], its adjusted p (Holm or BH), bold if it survives."""
    diff = cell.diff
    if diff is None or diff.n < 2:
        return "n/a" if diff is None else f"n/a (n={diff.n})"
    text = interval_text(diff, signed=True)
    if cell.family is not None:
        text += f" {'p_Holm' if cell.family == 'primary' else 'q_BH'}={cell.p_adjusted:.3g}"
    if diff.n < cell.planned:
        text += f" (n={diff.n})"
    return f"**{text}**" if cell.survives else text


def legend_lines(cells: dict[str, dict[str, Cell]], records: dict[str, dict[int, SeedRecord]],
                 columns: list[Column], settings: StatisticsSettings) -> list[str]:
    sizes = family_sizes(cells)
    tested = {k for k, cell in cells.get(settings.primary_method, {}).items() if cell.family == "primary"}
    primary = [c.header for c in columns if c.key in settings.primary_columns and (c.key in tested or not tested)]
    pct = round(100 * settings.confidence)
    return ["", f"mean ± std [{pct} % Student-t interval of the mean over seeds]; (n=k/N): k of the N seeds the "
            "method ran on have a value; n/a (reason): no seed has one; (values) did not learn: every run with a value "
            f"is below the utility floor (detection mAP@50 < {settings.map50_floor}, classification accuracy ≤ the "
            "test split's majority-class rate) and its fairness / privacy values are not compared. Paired "
            f"differences to {settings.baseline} use the seeds where both runs have a value (and learned). "
            f"**Bold**: the paired difference survives its correction at α = {settings.alpha}: Holm over the primary "
            f"family ({settings.primary_method} − {settings.baseline} on {', '.join(primary)}: "
            f"{sizes.get('primary', 0)} tests), Benjamini–Hochberg over every other paired cell (exploratory: "
            f"{sizes.get('exploratory', 0)} tests). FATE (CurvFed, at its printed 10× scale) is a ratio of means "
            f"over the common seeds with a delta-method {pct} % interval. ↓ lower is better, ↑ higher is better."
            + nothing_detected_legend(records, columns), ""]


def nothing_detected_legend(records: dict[str, dict[int, SeedRecord]], columns: list[Column]) -> str:
    """The legend's sentence on (values) nothing detected, only in a table where a learned run has TPR 0 in every
    group (the published tables without one keep their legend)."""
    if not any(r.learned_but_detected_nothing for seeds in records.values() for r in seeds.values()):
        return ""
    rates = ", ".join(c.header for c in columns if c.threshold_rates)
    return (" (values) nothing detected: the run learned but has TPR 0 in every group at the operating threshold "
            f"(no person detected at ufm.score_threshold), so its group rates compare nothing ({rates}: 0 − 0 and "
            "0/0); they are left out of every comparison as a run below the floor is.")


def note_lines(records: dict[str, dict[int, SeedRecord]], columns: list[Column]) -> list[str]:
    """Per method: failed runs, runs below the utility floor, seeds without a value, AIA ground-truth-box fallbacks,
    groups left out of the group metrics (metrics.min_group_size)."""
    lines = []
    rates = ", ".join(c.header for c in columns if c.threshold_rates)
    for method, seeds in records.items():
        failed = {s: r.failed for s, r in seeds.items() if r.failed is not None}
        below = {s: r.floor for s, r in seeds.items() if r.failed is None and r.floor is not None}
        fallback = [s for s, r in seeds.items() if r.failed is None and r.aia_fallback]
        excluded: dict[str, list[int]] = {}
        for s, r in seeds.items():
            if r.failed is None and r.groups_excluded:
                excluded.setdefault(", ".join(f"{g} ({n})" for g, n in r.groups_excluded.items()), []).append(s)
        for s, why in failed.items():
            lines.append(f"- {method}, seed {s}: failed: {why}")
        for s, why in below.items():
            lines.append(f"- {method}, seed {s}: did not learn ({why})")
        for s, r in seeds.items():
            if r.learned_but_detected_nothing and rates:
                lines.append(f"- {method}, seed {s}: nothing detected ({r.no_positive}); not compared: {rates}")
        if fallback:
            lines.append(f"- {method}, seeds {fallback}: the final AIA matched too few persons and probed the "
                         "ground-truth person boxes instead (attack.aia.min_matched)")
        for groups, which in excluded.items():
            lines.append(f"- {method}, seeds {which}: groups left out of every group metric (fewer units in the test "
                         f"split than metrics.min_group_size): {groups}")
        for c in columns:
            missing: dict[str, list[int]] = {}
            for s, r in seeds.items():
                if r.failed is None and r.values.get(c.key) is None and not isinstance(c, Fate):
                    missing.setdefault(r.reasons.get(c.key, "no value"), []).append(s)
            if missing and len(missing[next(iter(missing))]) < len(seeds):
                for why, which in missing.items():
                    lines.append(f"- {method}, {c.header}, seeds {which}: n/a ({why})")
    return ["", "Notes:", "", *lines] if lines else []


def has_value(cell: Cell) -> bool:
    return cell.interval.n > 0 or cell.greyed is not None or (cell.fate is not None and cell.fate.n > 0)


def empty_columns(cells: dict[str, dict[str, Cell]], columns: list[Column]) -> dict[str, str]:
    """header -> why: the columns no method has a value in (mAP@50 of a classification table, BA AD without
    --robustness); table.md leaves them out and says so, table.csv keeps them with their reasons."""
    empty = {}
    for c in columns:
        row = [by_key[c.key] for by_key in cells.values()]
        if not any(has_value(cell) for cell in row):
            reasons = Counter(cell.reason for cell in row if cell.reason)
            empty[c.header] = reasons.most_common(1)[0][0] if reasons else "no value"
    return empty


def table_lines(cells: dict[str, dict[str, Cell]], records: dict[str, dict[int, SeedRecord]], header: str,
                columns: list[Column], settings: StatisticsSettings, claims: list[Claim]) -> list[str]:
    """table.md's comparison: the values with their intervals, notes, paired differences, power and verdicts."""
    empty = empty_columns(cells, columns)
    columns = [c for c in columns if c.header not in empty]
    lines = [header, *legend_lines(cells, records, columns, settings),
             *([f"Left out, no run of this table has a value: {'; '.join(f'{h} ({why})' for h, why in empty.items())}.",
                ""] if empty else []),
             "| method | " + " | ".join(f"{c.header} {'↓' if c.lower_is_better else '↑'}" for c in columns) + " |",
             "| --- |" + " ---: |" * len(columns)]
    for method, row in cells.items():
        lines.append(f"| {method} | " + " | ".join(cell_text(row[c.key], c) for c in columns) + " |")
    lines += note_lines(records, columns)
    lines += difference_lines(cells, columns, settings)
    lines += power_lines(cells, columns, settings)
    lines += verdict_lines(records, cells, columns, claims, settings)
    return lines


def csv_text(cells: dict[str, dict[str, Cell]], columns: list[Column]) -> str:
    rows = [csv_row(method, c, row[c.key]) for method, row in cells.items() for c in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def draw_pareto(cells: dict[str, dict[str, Cell]], header: str, path: Path) -> None:
    from resfl_lightning.analysis.pareto import plot_pareto

    pareto = {m: {k: (cell.interval, cell.diff) for k, cell in row.items()} for m, row in cells.items()}
    plot_pareto(pareto, path, title=header.lstrip("# ").split(" (")[0])  # no timing in the figure


def csv_row(method: str, column: Column, cell: Cell) -> dict:
    iv, diff, fate = cell.interval, cell.diff, cell.fate
    if fate is not None:  # FATE's value and interval stand in the value columns
        iv = Interval(fate.value, math.nan, fate.low, fate.high, fate.n)
    return {"method": method, "metric": column.key, "mean": iv.mean, "std": iv.std, "ci_low": iv.low,
            "ci_high": iv.high, "n_seeds": iv.n, "seeds_run": cell.planned, "failed": cell.failed,
            "did_not_learn": cell.not_learned, "na_reason": cell.reason,
            "diff_vs_fedavg": None if diff is None else diff.mean,
            "diff_ci_low": None if diff is None else diff.low, "diff_ci_high": None if diff is None else diff.high,
            "diff_n": None if diff is None else diff.n, "p": None if diff is None else diff.p,
            "family": cell.family, "p_adjusted": None if cell.family is None else cell.p_adjusted,
            "survives_correction": cell.survives if cell.family is not None else None}


def difference_lines(cells: dict[str, dict[str, Cell]], columns: list[Column],
                     settings: StatisticsSettings) -> list[str]:
    """The paired differences to the baseline with their t-intervals and adjusted p, one row per method."""
    keys = [(c.header, c.key) for c in columns if c.paired]
    pct = round(100 * settings.confidence)
    lines = ["", f"Difference to {settings.baseline}, paired by seed: mean [{pct} % Student-t interval], then the "
             "p-value adjusted within its family (p_Holm: primary family, Holm; q_BH: exploratory, Benjamini–"
             "Hochberg over the table); (n=k): seeds with both values when fewer than the method ran on. **Bold**: "
             f"survives its correction at α = {settings.alpha}.", "",
             f"| method − {settings.baseline} | " + " | ".join(h for h, _ in keys) + " |",
             "| --- |" + " ---: |" * len(keys)]
    for method, row in cells.items():
        if method == settings.baseline:
            continue
        lines.append(f"| {method} | " + " | ".join(difference_text(row[key]) for _, key in keys) + " |")
    return lines


def quality_skewed_clients(config: dict) -> list[int] | None:
    """The clients scenario=quality_skew degraded in a run (from its config, as report.load_rounds reads it), None for
    other scenarios or a run without a config."""
    from resfl_lightning.data.quality_skew import skewed_clients

    dataset = config["dataset"] if "dataset" in config else {}
    qs = dataset["quality_skew"] if "quality_skew" in dataset else None
    if not qs:
        return None
    return skewed_clients(int(dataset["num_clients"]), float(qs["client_fraction"]), int(config["seed"]))


def mechanism_lines(out: Path, seed_sets: dict[str, list[int]],
                    records: dict[str, dict[int, SeedRecord]] | None = None) -> list[str]:
    """The mechanism table appended to table.md: medians / means over each run's rounds, then over seeds (each
    method over its own seeds; failed runs left out)."""
    from resfl_lightning.analysis.report import load_rounds  # metrics.jsonl rows, errors naming file, line

    mechanism_columns = load_mechanism_columns()

    lines = ["", "What UFM weighting had to act on (per run over its rounds, then mean ± std over seeds): the clients' "
             "bootstrap SE of raw UFM against its spread (std) across clients, medians over the rounds in which raw "
             "UFM differed across clients (before the model detects anyone every client's UFM is 0), the mean "
             "per-round Spearman correlation of client UFM with client validation ΔEOP, the mean largest client "
             "weight (1/N = uniform), the rounds in which every client was gated and, under quality_skew, the mean "
             "weight of a degraded and of a clean client over the rounds in which raw UFM differed.", "",
             "| method | " + " | ".join(h for h, _ in mechanism_columns) + " |",
             "| --- |" + " ---: |" * len(mechanism_columns)]
    for method, seeds in seed_sets.items():
        done = [s for s in seeds if records is None or records[method][s].failed is None]
        runs = [load_rounds(run_dir_for(out, method, seed)) for seed in done]
        per_seed = [run_mechanism(r.rows, quality_skewed_clients(r.config)) for r in runs]
        cells = [mean_sd_text(m[key] for m in per_seed) for _, key in mechanism_columns]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def dp_section(out: Path, seed_sets: dict[str, list[int]], records: dict[str, dict[int, SeedRecord]]) -> list[str]:
    """The DP-SGD accounting of the methods that ran it (analysis/dp_accounting.py), over their unfailed seeds."""
    return dp_accounting_lines({m: [run_dir_for(out, m, s) for s in seeds if records[m][s].failed is None]
                                for m, seeds in seed_sets.items()})


def log_wandb_table(out: Path, project: str) -> None:
    import wandb

    with (out / "table.csv").open() as fh:
        data = list(csv.reader(fh))
    run = wandb.init(project=project, name=out.name, dir=str(out), mode="offline", reinit=True)
    run.log({"comparison": wandb.Table(columns=data[0], data=data[1:])})
    run.finish()


def table_seeds(dataset: str, seeds: int | None, primary_seeds: int | None,
                settings: StatisticsSettings) -> tuple[int, int]:
    """(seeds of every method, seeds of the primary methods): the flags, else conf/table/statistics.yaml's defaults
    for the dataset; --seeds alone gives the primary methods as many."""
    default_seeds, default_primary = settings.default_seeds(dataset)
    n = default_seeds if seeds is None else seeds
    primary = primary_seeds if primary_seeds is not None else (default_primary if seeds is None else n)
    if n < 1:
        raise ExperimentError(f"--seeds must be >= 1, got {n}")
    if primary < n:
        raise ExperimentError(f"--primary-seeds ({primary}) must be >= --seeds ({n}): the primary methods run on more "
                         "seeds than the rest, never fewer")
    return n, primary


def method_seeds(methods: list[str], seeds: int, primary_seeds: int,
                 settings: StatisticsSettings) -> dict[str, list[int]]:
    """method -> the seeds it runs on: 0..primary_seeds-1 for the primary methods, 0..seeds-1 for the others."""
    return {m: list(range(primary_seeds if m in settings.primary_methods else seeds)) for m in methods}


def table_runs(seed_sets: dict[str, list[int]], attacks: list[str]) -> list[tuple[str, int, str]]:
    """Every (method, seed, attack) to train, seed by seed (the first seeds of every method finish first)."""
    last = max(max(s, default=-1) for s in seed_sets.values())
    return [(m, s, a) for s in range(last + 1) for m, ss in seed_sets.items() if s in ss for a in attacks]


class MethodTable(Experiment):
    """Every method (a preset of conf/algorithm/, or ctx.options `methods`) x seed, with the privacy attacks (and,
    with ctx.options `robustness` / `audit`, the attacked / audit runs the columns read), then table.md, table.csv and
    pareto.png (conf/table/: columns.yaml, statistics.yaml, claims.yaml). ctx.options: methods, seeds,
    primary_seeds, robustness, audit, audit_in_run, wandb."""

    writer = "resfl table"
    # the mechanism lines read every per-round row, the columns compare's Hydra config
    keep = {"metrics.jsonl": None, ".hydra/config.yaml": None}

    def setup(self, ctx: Context):
        """(settings, claims, columns, seed sets, attacks) of the table ctx asks for; errors name the option."""
        settings, claims = load_statistics(), load_claims()
        if settings.baseline != BASELINE:
            raise ExperimentError(f"conf/table/statistics.yaml: baseline {settings.baseline!r}: the table's run "
                                  f"directories pair every method with {BASELINE!r}")
        presets = algorithm_presets()
        methods = ctx.options.get("methods") or presets
        unknown = [m for m in methods if m not in presets]
        if unknown:
            raise ExperimentError(f"--methods: unknown {unknown}; choose from {', '.join(presets)}")
        if BASELINE not in methods:
            methods = [BASELINE, *methods]  # every paired difference and FATE needs the FedAvg runs
        n_seeds, n_primary = table_seeds(ctx.dataset, ctx.options.get("seeds"), ctx.options.get("primary_seeds"),
                                         settings)
        columns = load_columns()
        return (settings, claims, columns, method_seeds(methods, n_seeds, n_primary, settings),
                table_attacks(columns, ctx.options), n_seeds)

    def default_out(self, ctx: Context) -> Path:
        return experiment_out("table", ctx)

    def plan(self, ctx: Context, out: Path) -> list[PlannedRun]:
        *_, seed_sets, attacks, _ = self.setup(ctx)
        return [PlannedRun(run_dir_for(out, m, s, a).name,
                           train_overrides(ctx.dataset, ctx.scenario, m, s, run_dir_for(out, m, s, a), a,
                                           ctx.overrides, bool(ctx.options.get("audit_in_run"))))
                for m, s, a in table_runs(seed_sets, attacks)]

    def report(self, ctx: Context, runs: Runs) -> Report:
        settings, claims, columns, seed_sets, attacks, n_seeds = self.setup(ctx)
        out = runs.out
        records = {m: {s: seed_record(out, m, s, columns, attacks, settings) for s in ss}
                   for m, ss in seed_sets.items()}
        cells = summarise(records, columns, settings)
        more = [m for m in seed_sets if len(seed_sets[m]) > n_seeds]
        n_primary = max(len(ss) for ss in seed_sets.values())
        seeds_text = f"{n_seeds} seeds" + (f" ({n_primary} seeds for {', '.join(more)})" if more else "")
        header = (f"# {ctx.dataset}, scenario {ctx.scenario}: {len(seed_sets)} methods x {seeds_text} "
                  f"({len(runs.planned)} runs; this invocation took {runs.elapsed_s:.0f} s with --jobs {ctx.jobs}; "
                  f"the runs' own wall times sum to {runs.runs_wall_s:.0f} s)")
        lines = table_lines(cells, records, header, columns, settings, claims)
        text = "\n".join(lines) + "\n" + "\n".join(mechanism_lines(out, seed_sets, records)) + "\n"
        text += "".join(f"{line}\n" for line in client_leakage_lines(
            lambda m, s, a: run_dir_for(out, m, s, a), seed_sets, lambda m, s: records[m][s].failed is None))
        text += "".join(f"{line}\n" for line in dp_section(out, seed_sets, records))
        table_csv = csv_text(cells, columns)
        if ctx.options.get("wandb"):
            (out / "table.csv").write_text(table_csv)
            log_wandb_table(out, project="resfl-lightning")
        return Report(text, "table.md", {"pareto.png": lambda path: draw_pareto(cells, header, path)},
                      {"table.csv": table_csv})
