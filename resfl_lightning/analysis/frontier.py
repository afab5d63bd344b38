"""`resfl frontier`: the privacy-utility frontier of RESFL's adversary phi (docs/method.md §2, "phi's strength") and
the pre-registered choice of its strength (conf/table/adversary_frontier.yaml; the rule: analysis/frontier_rule.py).

Tuning: every grid point (phi strength x lambda_priv) and baseline on the tuning seeds, attack=privacy, trained by
analysis/runner.py (resumable: a finished run is reused once its saved config is checked to be what its command
composes to now); writes frontier.md (grid, rule, per-point means with Student-t intervals, verdicts, the selected
point), frontier.png and selection.json. Confirmation (--confirm): the selected point, RESFL's default and FedAvg on
the confirmation seeds, paired by seed; writes confirmation.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.analysis.execute import Context, Experiment, PlannedRun, Report, Runs, experiment_out
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.figures import save_figure
from resfl_lightning.analysis.frontier_rule import (
    PointSummary,
    Selection,
    confirmation_verdict,
    default_kept_verdict,
    select_point,
    utility_floor,
)
from resfl_lightning.analysis.run_data import RunData, finished_run
from resfl_lightning.analysis.table import table_preset
from resfl_lightning.metrics.intervals import interval_text
from resfl_lightning.metrics.statistics import TTest, paired_t, t_test
from resfl_lightning.resources import conf_dir

UTILITY = "utility"  # the rule's utility metric (validation accuracy or mAP@50), stored under this key per seed
FAIRNESS = "fairness"  # the rule's Fairness Score metric (validation), stored under this key per seed
TEST_UTILITY = "test_utility"  # the task's utility on the test split (run_data.UTILITY_KEYS): reported, never read
METRICS = ((UTILITY, "utility (rule)"), (TEST_UTILITY, "test utility"),
           ("attack/aia_balanced_accuracy", "AIA bal. acc."),
           ("attack/update_aia_balanced_accuracy", "update-AIA bal. acc."),
           ("attack/mia_success_rate", "MIA bal. acc."), ("test/delta_eop", "test ΔEOP"),
           (FAIRNESS, "Fairness Score (rule)"), ("score/fairness", "test Fairness Score"))


def grid_file() -> Path:
    return conf_dir() / "table" / "adversary_frontier.yaml"


@dataclass(frozen=True)
class Grid:
    method: str
    strengths: dict[str, str]  # strength -> conf/adversary/ preset, weakest first
    lambdas: list[float]
    tuning_seeds: list[int]
    confirmation_seeds: list[int]
    baselines: list[str]
    attacks: list[str]
    default: tuple[str, float]
    rule: dict
    text: str  # the file as written (quoted in frontier.md)
    use_tuned: bool = True  # whether the runs apply conf/tuned/ (the grid file's `use_tuned`)
    tuning_seeds_by_dataset: dict[str, list[int]] = field(default_factory=dict)  # where a dataset declares its own

    def for_dataset(self, dataset: str) -> Grid:
        """The grid with `dataset`'s own tuning seeds where tuning_seeds_by_dataset declares them."""
        return replace(self, tuning_seeds=self.tuning_seeds_by_dataset.get(dataset, self.tuning_seeds))


def load_grid(path: Path | None = None) -> Grid:
    path = Path(path or grid_file())
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    try:
        grid = Grid(method=str(raw["method"]), strengths={str(k): str(v) for k, v in raw["strengths"].items()},
                    lambdas=[float(x) for x in raw["lambda_priv"]], tuning_seeds=[int(s) for s in raw["tuning_seeds"]],
                    confirmation_seeds=[int(s) for s in raw["confirmation_seeds"]],
                    baselines=[str(b) for b in raw["baselines"]], attacks=[str(a) for a in raw["attacks"]],
                    default=(str(raw["default"]["strength"]), float(raw["default"]["lambda_priv"])), rule=raw["rule"],
                    text=path.read_text(), use_tuned=bool(raw.get("use_tuned", True)),
                    tuning_seeds_by_dataset={str(d): [int(s) for s in seeds]
                                             for d, seeds in (raw.get("tuning_seeds_by_dataset") or {}).items()})
        missing = [k for k in ("minimise", "utility", "fairness") if k not in grid.rule]
        if missing:
            raise KeyError(f"rule.{missing[0]}")
        missing = [f"rule.utility.{t}.metric" for t in ("classification", "detection")
                   if "metric" not in grid.rule["utility"].get(t, {})] + \
            ([] if "metric" in grid.rule["fairness"] else ["rule.fairness.metric"])
        if missing:
            raise KeyError(missing[0])
    except (KeyError, TypeError, AttributeError) as err:
        raise ExperimentError(f"{path}: missing or malformed key {err}") from None
    missing = [p for p in grid.strengths.values() if not (conf_dir() / "adversary" / f"{p}.yaml").is_file()]
    if missing:
        raise ExperimentError(f"{path}: strengths: no conf/adversary/ preset {missing}")
    if grid.default[0] not in grid.strengths or grid.default[1] not in grid.lambdas:
        raise ExperimentError(f"{path}: default {grid.default} is not a grid point")
    for seeds in (grid.tuning_seeds, *grid.tuning_seeds_by_dataset.values()):
        if not seeds or set(seeds) & set(grid.confirmation_seeds):
            raise ExperimentError(f"{path}: tuning seeds (and each tuning_seeds_by_dataset entry) must be non-empty "
                                  "and "
                                "disjoint from the confirmation seeds")
    if "fedavg" not in grid.baselines:
        raise ExperimentError(f"{path}: baselines must include fedavg (the utility reference)")
    return grid


@dataclass(frozen=True)
class Point:
    """A run configuration: a grid point (strength, lambda_priv) or a baseline method."""

    strength: str | None = None
    lambda_priv: float | None = None
    baseline: str | None = None

    @property
    def label(self) -> str:
        return self.baseline or f"{self.strength}, λ_priv={self.lambda_priv:g}"

    def dir_name(self, grid: Grid, seed: int) -> str:
        if self.baseline:
            return f"{self.baseline}-s{seed}"
        if self.lambda_priv == 0:  # no phi is trained: one run for every strength
            return f"{grid.method}-lp0-s{seed}"
        return f"{grid.method}-{self.strength}-lp{self.lambda_priv:g}-s{seed}"

    def overrides(self, grid: Grid) -> list[str]:
        if self.baseline:
            return [f"algorithm={self.baseline}"]
        strength = next(iter(grid.strengths)) if self.lambda_priv == 0 else self.strength
        return [f"algorithm={grid.method}", f"adversary={grid.strengths[strength]}",
                f"algorithm.lambda_priv={self.lambda_priv}"]


def grid_points(grid: Grid) -> list[Point]:
    return [Point(s, lam) for s in grid.strengths for lam in grid.lambdas]


def run_overrides(grid: Grid, point: Point, dataset: str, scenario: str, seed: int, run_dir: Path,
                  overrides: list[str]) -> list[str]:
    """One run's Hydra overrides: the common ones, the point's, then the user's (which win). Every run evaluates
    the final model on the validation union (the rule's val/* metrics)."""
    return [f"dataset={dataset}", f"scenario={scenario}", *table_preset(dataset, overrides), *point.overrides(grid),
            f"seed={seed}", "attack=privacy", f"attack.enabled=[{','.join(grid.attacks)}]", f"run_dir={run_dir}",
            "logger=none", "progress=false", "eval.final_validation=true",
            *([] if grid.use_tuned else ["use_tuned=false"]), *overrides]


def run_values(grid: Grid, run: RunData | None) -> dict[str, float | None] | None:
    """The frontier's metrics of one finished run (None: it did not finish): the rule's utility (its metric for the
    run's task) and Fairness Score under UTILITY and FAIRNESS, the test split's utility under TEST_UTILITY."""
    if run is None:
        return None
    out = {key: run.value(key) for key, _ in METRICS if key not in (UTILITY, FAIRNESS, TEST_UTILITY)}
    task = run.task
    out[UTILITY] = run.value(grid.rule["utility"][task]["metric"])
    out[FAIRNESS] = run.value(grid.rule["fairness"]["metric"])
    out[TEST_UTILITY] = run.utility
    out["task"] = task
    return out


def collect(grid: Grid, points: list[Point], seeds: list[int], out: Path) -> dict[str, dict[int, dict]]:
    """point label -> seed -> metric values (finished runs only)."""
    values: dict[str, dict[int, dict]] = {}
    for p in points:
        values[p.label] = {}
        for s in seeds:
            v = run_values(grid, finished_run(out / p.dir_name(grid, s)))
            if v is not None:
                values[p.label][s] = v
    return values


def series(values: dict[int, dict], key: str) -> dict[int, float | None]:
    return {s: v.get(key) for s, v in values.items()}


def summarise_points(grid: Grid, values: dict[str, dict[int, dict]]) -> tuple[list[PointSummary], float, str]:
    """Each grid point's rule inputs, the utility floor and the task."""
    tasks = {v["task"] for runs in values.values() for v in runs.values()}
    if len(tasks) != 1:
        raise ExperimentError(f"the runs hold {len(tasks)} tasks ({sorted(tasks)}); expected one")
    task = tasks.pop()
    u = grid.rule["utility"][task]
    fedavg = t_test(list(series(values["fedavg"], UTILITY).values()))
    floor = utility_floor(task, fedavg.mean, float(u.get("min_minus", 0.0)), float(u.get("min_times", 1.0)))
    fair = grid.rule["fairness"]
    default = Point(*grid.default).label
    ranks = {s: i for i, s in enumerate(grid.strengths)}
    out = []
    for p in grid_points(grid):
        runs = values[p.label]
        if p.label == default:
            upper = 0.0  # the default against itself: the difference is identically 0
        else:
            upper = paired_t(series(runs, FAIRNESS), series(values[default], FAIRNESS),
                             float(fair["confidence"])).high
        out.append(PointSummary(p.strength, p.lambda_priv, ranks[p.strength],
                                t_test(list(series(runs, grid.rule["minimise"]).values())).mean,
                                t_test(list(series(runs, UTILITY).values())).mean, upper))
    return out, floor, task


def _diff_cell(t: TTest) -> str:
    return "n/a" if t.n < 2 else f"{interval_text(t, signed=True)} (n={t.n})"


def frontier_markdown(grid: Grid, header: str, values: dict[str, dict[int, dict]], summaries: list[PointSummary],
                      floor: float, task: str, selection: Selection, failures: list[str]) -> str:
    pct = round(100 * float(grid.rule["fairness"]["confidence"]))
    lines = [header, "", "The grid and the selection rule, as pre-registered (conf/table/adversary_frontier.yaml):",
             "", "```yaml", grid.text.rstrip(), "```", "",
             f"Per point: mean [{pct} % Student-t interval] over the tuning seeds (n = seeds with a value). "
             f"The rule reads {grid.rule['utility'][task]['metric']} (utility) and {grid.rule['fairness']['metric']} "
             f"(Fairness Score); utility floor {floor:.4f} (from FedAvg's mean). The test columns are reported, "
             "never read by the rule. "
             "update-AIA: n/a where the attack does not apply (IID shards: no shadow client fits).", "",
             "| point | n | " + " | ".join(h for _, h in METRICS) + " | Fairness − default (paired) | verdict |",
             "| --- | ---: |" + " ---: |" * len(METRICS) + " ---: | --- |"]
    default = Point(*grid.default).label
    by_name = {s.name: s for s in summaries}
    labels = [p.label for p in grid_points(grid)] + list(grid.baselines)
    for label in labels:
        runs = values.get(label, {})
        cells = [interval_text(t_test(list(series(runs, k).values()))) for k, _ in METRICS]
        if label in by_name:
            diff = "—" if label == default else _diff_cell(paired_t(series(runs, FAIRNESS),
                                                                    series(values[default], FAIRNESS)))
            verdict = selection.verdicts[label]
        else:
            diff, verdict = "—", "baseline"
        lines.append(f"| {label} | {len(runs)} | " + " | ".join(cells) + f" | {diff} | {verdict} |")
    lines += ["", f"**Selection:** {selection.reason}.", "", "![frontier](frontier.png)"]
    if failures:
        lines += ["", "Failed runs (re-run the same command to retry them):", "", *[f"- {f}" for f in failures]]
    return "\n".join(lines) + "\n"


def plot_frontier(grid: Grid, values: dict[str, dict[int, dict]], selection: Selection, path: Path,
                  title: str, task: str, floor: float) -> None:
    """AIA balanced accuracy against utility: one line per phi strength over lambda_priv, the baselines as points,
    the rule's utility floor as a line; error bars are the Student-t intervals of the means."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    aia = grid.rule["minimise"]

    def xy(label):
        u, a = (t_test(list(series(values.get(label, {}), k).values())) for k in (UTILITY, aia))
        return u, a

    def err(t):
        return 0.0 if t.n < 2 else t.high - t.mean

    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    shown = []  # utilities of the points the rule compares (grid points, FedAvg): the x-axis is theirs
    for strength in grid.strengths:
        pts = [(lam, *xy(Point(strength, lam).label)) for lam in grid.lambdas]
        pts = [(lam, u, a) for lam, u, a in pts if u.n and a.n]
        if not pts:
            continue
        shown += [(u.mean - err(u), u.mean + err(u)) for _, u, _ in pts]
        line = ax.errorbar([u.mean for _, u, _ in pts], [a.mean for _, _, a in pts],
                           xerr=[err(u) for _, u, _ in pts], yerr=[err(a) for _, _, a in pts], marker="o",
                           capsize=3, label=f"RESFL, {strength} φ")
        for lam, u, a in pts:
            ax.annotate(f"{lam:g}", (u.mean, a.mean), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=line[0].get_color())
    baselines = {b: xy(b) for b in grid.baselines}
    baselines = {b: (u, a) for b, (u, a) in baselines.items() if u.n and a.n}
    if "fedavg" in baselines:
        u = baselines["fedavg"][0]
        shown.append((u.mean - err(u), u.mean + err(u)))
    low, high = (min(lo for lo, _ in shown), max(hi for _, hi in shown)) if shown else (0.0, 1.0)
    pad = max(0.05 * (high - low), 0.01)
    left = low - 4 * pad  # room for the off-scale markers
    for marker, (baseline, (u, a)) in zip("sD^v", baselines.items()):
        color = "black" if baseline == "fedavg" else "grey"
        if shown and u.mean < left:  # a baseline that learned far less (DP-SGD): marked at the edge, value in words
            ax.errorbar([left + pad], [a.mean], yerr=[err(a)], marker="<", linestyle="none", capsize=3, color=color,
                        label=f"{baseline} (utility {u.mean:.3g}, off scale)")
            continue
        ax.errorbar([u.mean], [a.mean], xerr=[err(u)], yerr=[err(a)], marker=marker, linestyle="none",
                    capsize=3, color=color, label=baseline)
        high = max(high, u.mean + err(u))
    if selection.selected is not None:
        u, a = xy(Point(selection.selected.strength, selection.selected.lambda_priv).label)
        ax.scatter([u.mean], [a.mean], s=250, marker="*", facecolors="none", edgecolors="red", label="selected")
    ax.axvline(floor, color="black", linestyle=":", linewidth=1, label=f"utility floor {floor:.3g}")
    if shown:
        ax.set_xlim(left, high + pad)
    ax.set_xlabel(f"utility the rule reads ({grid.rule['utility'][task]['metric']}) ↑")
    ax.set_ylabel("AIA balanced accuracy ↓")
    save_figure(fig, ax, title, path)


def _confirmation(grid: Grid, values: dict[str, dict[int, dict]], selected: Point, default: Point) -> tuple[bool, str]:
    """The pre-registered rule applied to the confirmation seeds (frontier_rule.confirmation_verdict)."""
    tasks = {v["task"] for runs in values.values() for v in runs.values()}
    task = tasks.pop() if len(tasks) == 1 else "classification"
    u = grid.rule["utility"][task]
    fed = t_test(list(series(values["fedavg"], UTILITY).values())).mean
    floor = utility_floor(task, fed, float(u.get("min_minus", 0.0)), float(u.get("min_times", 1.0)))
    utility = t_test(list(series(values[selected.label], UTILITY).values())).mean
    if selected == default:  # paired differences to itself are identically 0: only the utility floor can be checked
        return default_kept_verdict(utility, floor)
    fair, conf = grid.rule["fairness"], float(grid.rule["fairness"]["confidence"])
    aia = paired_t(series(values[selected.label], grid.rule["minimise"]),
                   series(values[default.label], grid.rule["minimise"]), conf)
    gap = paired_t(series(values[selected.label], FAIRNESS), series(values[default.label], FAIRNESS), conf)
    return confirmation_verdict(utility, floor, aia.low, aia.high, gap.high, float(fair["max_upper"]))


def parse_point(text: str, grid: Grid) -> Point:
    """`STRENGTH,LAMBDA_PRIV` (e.g. `weak,0.1`) as a grid point of `grid`."""
    strength, _, lam = text.partition(",")
    try:
        point = Point(strength.strip(), float(lam))
    except ValueError:
        raise ExperimentError(f"--point {text!r}: expected STRENGTH,LAMBDA_PRIV such as weak,0.1") from None
    if point.strength not in grid.strengths or point.lambda_priv not in grid.lambdas:
        raise ExperimentError(f"--point {text!r} is not a grid point (strengths {list(grid.strengths)}, lambda_priv "
                            f"{grid.lambdas})")
    return point


def _saved_selection(out: Path, grid: Grid, grid_path: Path | None) -> tuple[Point, str]:
    """The point OUT/selection.json holds, and the rule's reason for it."""
    path = out / "selection.json"
    if not path.is_file():
        raise ExperimentError(f"{path} does not exist: run the tuning stage (the same command without --confirm) "
                            "first, or name the point a published frontier selected with --point")
    saved = json.loads(path.read_text())
    if saved.get("grid") != grid.text:
        raise ExperimentError(f"{path} was selected under another grid file than {grid_path or grid_file()}; a "
                            "confirmation must test what the pre-registered rule selected")
    if saved["selected"] is None:
        raise ExperimentError(f"nothing to confirm: {saved['reason']}")
    point = Point(saved["selected"]["strength"], float(saved["selected"]["lambda_priv"]))
    return point, f"Selected on the tuning seeds {grid.tuning_seeds}: {saved['reason']}."


class Frontier(Experiment):
    """φ's frontier of a grid file (this class's, or ctx.options `grid`). Tuning stage: every grid point and the
    baselines on the tuning seeds, then frontier.md, frontier.png and selection.json. With ctx.options `confirm`:
    the selected point (OUT/selection.json, or ctx.options `point` as STRENGTH,LAMBDA_PRIV), RESFL's default and
    FedAvg on the confirmation seeds, then confirmation.md."""

    writer = "resfl frontier"

    def grid(self, ctx: Context) -> Grid:
        # the dataset's own tuning seeds in both stages: the confirmation names the seeds its point was selected on
        return load_grid(ctx.options.get("grid") or self.grid_path).for_dataset(ctx.dataset)

    def default_out(self, ctx: Context) -> Path:
        return experiment_out("frontier", ctx)

    def stage(self, ctx: Context, out: Path) -> tuple[Grid, list[Point], list[int], Point | None, str]:
        """(grid, points, seeds, the point confirmed (None: tuning), where that point came from)."""
        grid = self.grid(ctx)
        if not ctx.options.get("confirm"):
            return grid, grid_points(grid) + [Point(baseline=b) for b in grid.baselines], grid.tuning_seeds, None, ""
        point = ctx.options.get("point")
        if point is None:
            selected, provenance = _saved_selection(out, grid, ctx.options.get("grid"))
        else:
            selected = parse_point(point, grid)
            provenance = (f"The point was named on the command line (--point {point}), not read from a selection "
                          "made on this machine: the frontier's results file says which point its rule selected.")
        points = list(dict.fromkeys([selected, Point(*grid.default), Point(baseline="fedavg")]))
        return grid, points, grid.confirmation_seeds, selected, provenance

    def plan(self, ctx: Context, out: Path) -> list[PlannedRun]:
        grid, points, seeds, _, _ = self.stage(ctx, out)
        return [PlannedRun(p.dir_name(grid, s), run_overrides(grid, p, ctx.dataset, ctx.scenario, s,
                                                              out / p.dir_name(grid, s), ctx.overrides))
                for p in points for s in seeds]

    def report(self, ctx: Context, runs: Runs) -> Report:
        grid, points, seeds, selected, provenance = self.stage(ctx, runs.out)
        values = collect(grid, points, seeds, runs.out)
        if selected is None:
            return self.tuning_report(ctx, runs, grid, points, values)
        return self.confirmation_report(ctx, runs, grid, points, values, selected, provenance)

    def tuning_report(self, ctx: Context, runs: Runs, grid: Grid, points: list[Point], values) -> Report:
        if not values["fedavg"]:
            raise ExperimentError("no FedAvg run finished: the utility floor is undefined\n"
                                  + "\n".join(runs.failures))
        summaries, floor, task = summarise_points(grid, values)
        selection = select_point(summaries, floor, float(grid.rule["fairness"]["max_upper"]))
        self.selection = selection
        title = f"Adversary frontier: {ctx.dataset}, scenario {ctx.scenario}"
        header = (f"# {title} ({len(grid_points(grid))} grid points and {len(grid.baselines)} baselines x "
                  f"{len(grid.tuning_seeds)} tuning seeds; " + _header_tail(runs) + ")")
        text = frontier_markdown(grid, header, values, summaries, floor, task, selection, runs.failures)
        chosen = selection.selected
        saved = json.dumps({
            "selected": None if chosen is None else {"strength": chosen.strength, "lambda_priv": chosen.lambda_priv},
            "reason": selection.reason, "utility_floor": floor, "task": task, "grid": grid.text}, indent=1)
        return Report(text, "frontier.md", {"frontier.png": lambda path: plot_frontier(grid, values, selection, path,
                                                                                       title, task, floor)},
                      {"selection.json": saved})

    def confirmation_report(self, ctx: Context, runs: Runs, grid: Grid, points: list[Point], values,
                            selected: Point, provenance: str) -> Report:
        default, fedavg = Point(*grid.default), Point(baseline="fedavg")
        seeds = grid.confirmation_seeds
        pct = round(100 * float(grid.rule["fairness"]["confidence"]))
        compared = (f"selected {selected.label} vs RESFL default {default.label}" if selected != default
                    else f"selected = RESFL default {default.label}")
        lines = [f"# Adversary frontier, confirmation: {ctx.dataset}, scenario {ctx.scenario} ({compared} vs FedAvg, "
                 f"{len(seeds)} confirmation seeds {seeds[0]}-{seeds[-1]}; " + _header_tail(runs) + ")", "",
                 provenance, "",
                 f"Means [{pct} % Student-t interval] over the confirmation seeds:", "",
                 "| run | n | " + " | ".join(h for _, h in METRICS) + " |",
                 "| --- | ---: |" + " ---: |" * len(METRICS)]
        for p in points:
            done = values[p.label]
            lines.append(f"| {p.label} | {len(done)} | "
                         + " | ".join(interval_text(t_test(list(series(done, k).values()))) for k, _ in METRICS) + " |")
        pairs = list(dict.fromkeys([(selected, default), (selected, fedavg), (default, fedavg)]))  # once each
        lines += ["", f"Paired differences by seed: mean [{pct} % Student-t interval] (n = seeds where both have a "
                  "value). The selection confirms if utility stays within the rule's floor, the AIA difference to "
                  "the default is negative with an interval below 0, and the Fairness Score difference's upper end "
                  f"is <= {grid.rule['fairness']['max_upper']}.", "",
                  "| difference | " + " | ".join(h for _, h in METRICS) + " |",
                  "| --- |" + " ---: |" * len(METRICS)]
        for a, b in pairs:
            if a == b:
                continue
            cells = [_diff_cell(paired_t(series(values[a.label], k), series(values[b.label], k),
                                         float(grid.rule["fairness"]["confidence"]))) for k, _ in METRICS]
            lines.append(f"| {a.label} − {b.label} | " + " | ".join(cells) + " |")
        confirmed, why = _confirmation(grid, values, selected, default)
        word = ("default kept" if confirmed else "default kept, under the utility floor") if selected == default \
            else ("confirmed" if confirmed else "not confirmed")
        lines += ["", f"**Verdict: {word}** ({why})."]
        if runs.failures:
            lines += ["", "Failed runs (re-run the same command to retry them):", "",
                      *[f"- {f}" for f in runs.failures]]
        return Report("\n".join(lines) + "\n", "confirmation.md", suffix="-confirmation")


def _header_tail(runs: Runs) -> str:
    return (f"{len(runs.planned)} runs; this invocation took {runs.elapsed_s:.0f} s; the runs' own wall times sum to "
            f"{runs.runs_wall_s:.0f} s")
