"""`resfl dp-curve`: the DP privacy-utility curve (utility against epsilon, and the epsilon at which each DP method
starts to learn: docs/method.md §5a "DP baselines") of the pre-registered grid conf/table/dp_curve.yaml: every DP method
x target epsilon x seed and the non-DP ablations, trained by analysis/runner.py (resumable: a finished run is reused
once its saved config is checked to be what its command composes to now), then OUT/dp-curve.md (provenance header, the
grid, one row per method and epsilon: utility mean with its Student-t interval over the seeds beside the runs' z, q,
S_k, C, delta, spent epsilon and NSR; each clipping-only row as a share of each ablation's utility) and
OUT/dp-curve.png (utility against epsilon). The accounting numbers are the runs' summary.json `dp/` keys
(analysis/dp_accounting.py, callbacks/reports.py)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.analysis.dp_accounting import accounting_cells, run_values
from resfl_lightning.analysis.execute import Context, Experiment, PlannedRun, Report, Runs, experiment_out
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.figures import save_figure, series_style
from resfl_lightning.analysis.statistics import load_statistics
from resfl_lightning.analysis.table import table_preset
from resfl_lightning.metrics.intervals import interval_text
from resfl_lightning.metrics.statistics import TTest, relative_change, t_test
from resfl_lightning.resources import conf_dir
from resfl_lightning.run_config.tuned import recorded_path


def grid_file() -> Path:
    return conf_dir() / "table" / "dp_curve.yaml"


@dataclass(frozen=True)
class CurveGrid:
    methods: list[str]
    epsilons: list[float]  # math.inf: clipping only (noise multiplier 0)
    ablations: dict[str, list[str]]  # label -> overrides
    seeds: list[int]
    attack: str
    confidence: float
    text: str  # the file as written (quoted in dp-curve.md)
    source: str  # where it was read, repository-relative where it can be (named in dp-curve.md)
    method_overrides: tuple[str, ...] = ()  # given to every DP method's run (not the ablations), before its epsilon


def _epsilon(value, where: str) -> float:
    eps = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else \
        float("inf") if value in ("inf", ".inf") else None
    if eps is None or not eps > 0:
        raise ExperimentError(f"{where}: expected a positive number or inf, got {value!r}")
    return eps


def load_grid(path: Path | None = None) -> CurveGrid:
    """The grid file, checked; every error names the file and the key."""
    path = Path(path or grid_file())
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    if not isinstance(raw, dict):
        raise ExperimentError(f"{path}: expected a mapping of keys")
    for key in ("methods", "epsilon", "ablations", "seeds", "attack", "confidence"):
        if key not in raw:
            raise ExperimentError(f"{path}: {key}: missing")
    methods, epsilons, seeds = raw["methods"], raw["epsilon"], raw["seeds"]
    if not isinstance(methods, list) or not methods or not all(isinstance(m, str) for m in methods):
        raise ExperimentError(f"{path}: methods: expected a non-empty list of conf/algorithm/ presets, got {methods!r}")
    for i, m in enumerate(methods):
        preset = conf_dir() / "algorithm" / f"{m}.yaml"
        if not preset.is_file():
            raise ExperimentError(f"{path}: methods[{i}]: no preset {preset}")
        if "dp" not in OmegaConf.load(preset):
            raise ExperimentError(f"{path}: methods[{i}]: {m} is no DP-SGD preset (no `dp:` node in {preset})")
    if not isinstance(epsilons, list) or not epsilons:
        raise ExperimentError(f"{path}: epsilon: expected a non-empty list, got {epsilons!r}")
    eps = [_epsilon(e, f"{path}: epsilon[{i}]") for i, e in enumerate(epsilons)]
    if len(set(eps)) != len(eps):
        raise ExperimentError(f"{path}: epsilon: values repeat: {epsilons}")
    ablations = raw["ablations"] or {}
    if not isinstance(ablations, dict):
        raise ExperimentError(f"{path}: ablations: expected a mapping label -> list of overrides, got {ablations!r}")
    for label, ov in ablations.items():
        if not re.fullmatch(r"[A-Za-z0-9_]+", str(label)) or str(label) in methods:
            raise ExperimentError(f"{path}: ablations.{label}: a label is letters, digits and _, and no method's name")
        if not isinstance(ov, list) or not ov or not all(isinstance(o, str) and "=" in o for o in ov):
            raise ExperimentError(f"{path}: ablations.{label}: expected a non-empty list of key=value overrides, got "
                                  f"{ov!r}")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool)
                                                           for s in seeds) or len(set(seeds)) != len(seeds):
        raise ExperimentError(f"{path}: seeds: expected a non-empty list of distinct integers, got {seeds!r}")
    attack = raw["attack"]
    if not isinstance(attack, str) or not (conf_dir() / "attack" / f"{attack}.yaml").is_file():
        raise ExperimentError(f"{path}: attack: expected a conf/attack/ preset, got {attack!r}")
    confidence = raw["confidence"]
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ExperimentError(f"{path}: confidence: expected a number in (0, 1), got {confidence!r}")
    shared = raw.get("method_overrides") or []
    if not isinstance(shared, list) or not all(isinstance(o, str) and "=" in o for o in shared):
        raise ExperimentError(f"{path}: method_overrides: expected a list of key=value overrides, got {shared!r}")
    if any(o.split("=", 1)[0].strip() in EPSILON_KEYS for o in shared):
        raise ExperimentError(f"{path}: method_overrides: the epsilon grid sets {', '.join(EPSILON_KEYS)}")
    return CurveGrid(list(methods), eps, {str(k): list(v) for k, v in ablations.items()}, list(seeds), attack,
                     float(confidence), path.read_text(), recorded_path(path), tuple(shared))


def epsilon_text(eps: float) -> str:
    return "inf" if math.isinf(eps) else f"{eps:g}"


EPSILON_KEYS = ("algorithm.dp.target_epsilon", "algorithm.dp.noise_multiplier")  # what epsilon_overrides sets


def epsilon_overrides(eps: float) -> list[str]:
    """A run-level target epsilon; inf = clipping only (noise multiplier 0: no finite epsilon)."""
    target, noise = EPSILON_KEYS
    if math.isinf(eps):
        return [f"{target}=null", f"{noise}=0.0"]
    return [f"{target}={eps!r}", f"{noise}=null"]


@dataclass(frozen=True)
class CurvePoint:
    """A row of the curve: a DP method at a target epsilon, or an ablation (epsilon None)."""

    name: str  # the method's preset or the ablation's label
    epsilon: float | None = None

    @property
    def label(self) -> str:
        return self.name if self.epsilon is None else f"{self.name}, ε={epsilon_text(self.epsilon)}"

    def dir_name(self, seed: int) -> str:
        if self.epsilon is None:
            return f"{self.name}-s{seed}"
        return f"{self.name}-eps{epsilon_text(self.epsilon)}-s{seed}"

    def overrides(self, grid: CurveGrid) -> list[str]:
        if self.epsilon is None:
            return list(grid.ablations[self.name])
        return [f"algorithm={self.name}", *grid.method_overrides, *epsilon_overrides(self.epsilon)]


def curve_points(grid: CurveGrid) -> list[CurvePoint]:
    return [CurvePoint(m, e) for m in grid.methods for e in grid.epsilons] + [CurvePoint(a) for a in grid.ablations]


def run_overrides(grid: CurveGrid, point: CurvePoint, dataset: str, scenario: str, seed: int, run_dir: Path,
                  overrides: list[str]) -> list[str]:
    """One run's Hydra overrides: the common ones, the point's, then the user's (which win)."""
    return [f"dataset={dataset}", f"scenario={scenario}", *table_preset(dataset, overrides), *point.overrides(grid),
            f"seed={seed}", f"attack={grid.attack}", f"run_dir={run_dir}", "logger=none", "progress=false",
            *overrides]


@dataclass(frozen=True)
class RowSummary:
    point: CurvePoint
    runs: list[dict]  # one per finished seed
    utility: TTest
    seeds: tuple[int, ...] = ()  # the seeds of `runs`, in order

    def utilities(self) -> dict[int, float]:
        return {s: r["utility"] for s, r in zip(self.seeds, self.runs) if r.get("utility") is not None}

    def learned(self) -> tuple[int, int]:
        """(seeds above the table's utility floor, seeds with a utility value)."""
        judged = [r for r in self.runs if r.get("utility") is not None]
        return sum(r.get("below_floor") is None for r in judged), len(judged)


def summarise(point: CurvePoint, runs: dict[int, dict], confidence: float) -> RowSummary:
    rows = [runs[s] for s in sorted(runs)]
    return RowSummary(point, rows, t_test([r["utility"] for r in rows if r["utility"] is not None], confidence),
                      tuple(sorted(runs)))


def clipping_only_lines(grid: CurveGrid, rows: list[RowSummary]) -> list[str]:
    """Each DP method's ε = ∞ (clipping only) utility as a share of each ablation's: mean over the common seeds over
    mean, with the delta-method interval of metrics/statistics.py::relative_change (+1). Descriptive: the grid
    declares no threshold."""
    refs = [r for r in rows if r.point.epsilon is None and r.utilities()]
    clips = [r for r in rows if r.point.epsilon is not None and math.isinf(r.point.epsilon) and r.utilities()]
    if not refs or not clips:
        return []
    pct = round(100 * grid.confidence)
    lines = ["", f"Clipping only (ε = ∞) as a share of each reference without DP-SGD: mean over mean on the seeds "
             f"both finished, [{pct} % delta-method interval], (n seeds):", "",
             "| method | " + " | ".join(f"/ {r.point.name}" for r in refs) + " |",
             "| --- |" + " ---: |" * len(refs)]
    for clip in clips:
        cells = []
        for ref in refs:
            rc = relative_change(clip.utilities(), ref.utilities(), grid.confidence)
            cells.append("—" if not rc.n or math.isnan(rc.value) else
                         f"{rc.value + 1:.3f} (n={rc.n})" if rc.n < 2 else
                         f"{rc.value + 1:.3f} [{rc.low + 1:.3f}, {rc.high + 1:.3f}] (n={rc.n})")
        lines.append(f"| {clip.point.name} | " + " | ".join(cells) + " |")
    return lines


def utility_cell(t: TTest) -> str:
    return interval_text(t, 4)


def row_cells(row: RowSummary) -> list[str]:
    """ε target, n, utility, seeds that learned, z, q, S_k, C, δ, spent ε (the largest over seeds), NSR (mean
    over seeds)."""
    p = row.point
    target = "no DP" if p.epsilon is None else ("∞ (clipping only)" if math.isinf(p.epsilon) else f"{p.epsilon:g}")
    learned, judged = row.learned()
    return [target, str(len(row.runs)), utility_cell(row.utility), f"{learned}/{judged}" if judged else "—",
            *accounting_cells(row.runs)]


def learns(row: RowSummary) -> bool | None:
    """Whether every finished seed of the row is above the table's utility floor (None: no finished seed)."""
    learned, judged = row.learned()
    return None if not judged else learned == judged


def learns_from(grid: CurveGrid, rows: list[RowSummary], method: str) -> str:
    """The smallest target ε of the grid from which on the method learns at it and at every larger ε (so one lucky
    ε below a failing one does not count), as the curve's text states it."""
    found = {r.point.epsilon: learns(r) for r in rows if r.point.name == method and r.point.epsilon is not None}
    by_eps = [(eps, found.get(eps)) for eps in sorted(grid.epsilons)]
    if any(ok is None for _, ok in by_eps):
        return f"{method}: not decidable (a target ε has no finished run)"
    start = None
    for eps, ok in reversed(by_eps):
        if not ok:
            break
        start = eps
    if start is None:
        return f"{method}: learns at no ε of the grid"
    return (f"{method}: learns from ε = {epsilon_text(start)} on" if start != by_eps[0][0]
            else f"{method}: learns at every ε of the grid (from {epsilon_text(start)})")


def curve_markdown(grid: CurveGrid, title: str, rows: list[RowSummary], task: str, failures: list[str]) -> str:
    pct = round(100 * grid.confidence)
    metric = "mAP@50" if task == "detection" else "accuracy"
    lines = [f"# {title}", "", f"The grid, as pre-registered ({grid.source}):", "", "```yaml",
             grid.text.rstrip(), "```", "",
             f"Utility: test {metric}, mean [{pct} % Student-t interval] over the seeds (n = finished seeds). Per run "
             "(summary.json `dp/`): z the noise multiplier, q = B/n_k the Poisson sampling rate, S_k the DP-SGD steps "
             "a client took, C the clipping norm, δ the target delta, spent ε the accountant's ε at δ (the largest "
             "over clients; this cell: over seeds), NSR = zC/(B‖ḡ_c‖) with ḡ_c the noise-free mean of the clipped "
             "per-sample gradients (per client the median over its steps, then the median over clients; this cell: "
             "the mean over seeds). z, q, S_k are the median client's; a range means the seeds differ. ε = ∞: "
             "clipping without noise." + (f" Ablations (no DP-SGD; overrides and comments in the grid above): "
                                         f"{', '.join(grid.ablations)}." if grid.ablations else ""), "",
             "| method | ε target | n | utility | learned | z | q | S_k | C | δ | spent ε | NSR |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r.point.name} | " + " | ".join(row_cells(r)) + " |" for r in rows]
    floor = ("mAP@50 ≥ the table's floor (conf/table/statistics.yaml utility_floor)" if task == "detection"
             else "accuracy above the test split's majority-class rate")
    lines += ["", f"Where each method starts to learn (learned: seeds with {floor}, the table's \"did not learn\" "
              "rule; a method learns at ε when every finished seed learned, and starts to learn at the smallest ε "
              "from which it learns at every larger ε of the grid):", "",
              *[f"- {learns_from(grid, rows, m)}" for m in grid.methods]]
    lines += clipping_only_lines(grid, rows)
    lines += ["", "![dp-curve](dp-curve.png)"]
    if failures:
        lines += ["", "Failed runs (re-run the same command to retry them):", "", *[f"- {f}" for f in failures]]
    return "\n".join(lines) + "\n"


DODGE = 1.07  # x factor between neighbouring methods' points on the log ε axis


def plot_curve(grid: CurveGrid, rows: list[RowSummary], path: Path, title: str, task: str) -> None:
    """Utility against the target epsilon (log scale; ∞ drawn right of the largest finite one), one line per method
    with its Student-t intervals; the ablations as horizontal lines with their interval bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = sorted(e for e in grid.epsilons if math.isfinite(e))
    inf_x = (finite[-1] * 4) if finite else 1.0

    def x_of(eps: float) -> float:
        return inf_x if math.isinf(eps) else eps

    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for i, method in enumerate(grid.methods):
        pts = sorted((x_of(r.point.epsilon), r.utility) for r in rows
                     if r.point.name == method and r.point.epsilon is not None and r.utility.n)
        dodge = DODGE ** (i - (len(grid.methods) - 1) / 2)  # the methods' intervals at one ε overlap otherwise
        if pts:
            ax.errorbar([x * dodge for x, _ in pts], [t.mean for _, t in pts],
                        yerr=[0.0 if t.n < 2 else t.high - t.mean for _, t in pts], capsize=3, label=method,
                        **series_style(i))
    for style, r in zip(("--", ":", "-.", (0, (5, 1))), [r for r in rows if r.point.epsilon is None]):
        if not r.utility.n:
            continue
        line = ax.axhline(r.utility.mean, linestyle=style, color="grey" if r.point.name != "fedavg" else "black",
                          label=f"{r.point.name} (no DP)")
        if r.utility.n >= 2:
            ax.axhspan(r.utility.low, r.utility.high, color=line.get_color(), alpha=0.12)
    ticks = finite + ([inf_x] if any(math.isinf(e) for e in grid.epsilons) else [])
    ax.set_xscale("log")
    ax.set_xticks(ticks, [f"{e:g}" for e in finite] + (["∞\n(clip only)"] if len(ticks) > len(finite) else []))
    ax.minorticks_off()
    ax.set_xlabel("target ε per client (δ = 1e-6)")
    ax.set_ylabel(f"test {'mAP@50' if task == 'detection' else 'accuracy'} ↑")
    save_figure(fig, ax, title, path)


class DpCurve(Experiment):
    """The curve of a grid file (this class's file, or ctx.options `grid`; ctx.options `seeds`: seeds instead of the
    grid's): every DP method x target ε x seed and the ablations, then dp-curve.md and dp-curve.png."""

    writer = "resfl dp-curve"

    def grid(self, ctx: Context) -> CurveGrid:
        return load_grid(ctx.options.get("grid") or self.grid_path)

    def seeds(self, ctx: Context, grid: CurveGrid) -> list[int]:
        return list(ctx.options.get("seeds") or grid.seeds)

    def default_out(self, ctx: Context) -> Path:
        return experiment_out("dp-curve", ctx)

    def plan(self, ctx: Context, out: Path) -> list[PlannedRun]:
        grid = self.grid(ctx)
        return [PlannedRun(p.dir_name(s), run_overrides(grid, p, ctx.dataset, ctx.scenario, s, out / p.dir_name(s),
                                                        ctx.overrides))
                for p in curve_points(grid) for s in self.seeds(ctx, grid)]

    def report(self, ctx: Context, runs: Runs) -> Report:
        grid = self.grid(ctx)
        seeds = self.seeds(ctx, grid)
        rows, tasks, floor = [], set(), load_statistics().map50_floor
        for p in curve_points(grid):
            values = {s: v for s in seeds if (v := run_values(runs.get(p.dir_name(s)), floor)) is not None}
            tasks |= {v["task"] for v in values.values()}
            rows.append(summarise(p, values, grid.confidence))
        if len(tasks) > 1:
            raise ExperimentError(f"the runs in {runs.out} hold {len(tasks)} tasks ({sorted(tasks)}); expected one")
        task = tasks.pop() if tasks else "classification"
        title = (f"DP privacy-utility curve: {ctx.dataset}, scenario {ctx.scenario} ({_count(grid.methods, 'method')} "
                 f"x {len(grid.epsilons)} ε and {_count(grid.ablations, 'ablation')} x {_count(seeds, 'seed')} = "
                 f"{len(runs.planned)} runs)")
        text = curve_markdown(grid, title, rows, task, runs.failures)
        return Report(text, "dp-curve.md", {"dp-curve.png": lambda path: plot_curve(grid, rows, path, title, task)})


def _count(items, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"
