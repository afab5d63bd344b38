"""One experiment pipeline. An experiment is a declaration — a grid file in conf/table/ naming its class by
`_target_` — and a class that plans its runs and reports on them; `execute` does everything the experiments share:
where the runs live, refusing finished runs trained with other settings than the plan gives them now, the launcher
and the ledger, reading the runs through one reader, writing the report with its provenance, and failing after
writing when a run failed. A new experiment is one module (an Experiment subclass) and one grid file.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resfl_lightning.analysis.experiment import ExperimentError, raise_failures, refuse_stale
from resfl_lightning.analysis.run_data import RunData, finished_run
from resfl_lightning.analysis.run_records import summed_wall

# `touch <out>/STOP` while a command runs: it starts no more runs, lets the ones in flight finish, and removes the file
STOP_FILE = "STOP"


@dataclass(frozen=True)
class Context:
    """What a command asks of an experiment: the data, the user's overrides for every run, how many runs at once,
    where the runs and the published file go, the command line, and the command's own options."""

    dataset: str
    scenario: str
    overrides: list[str]
    jobs: int = 1
    command: str = ""
    out: Path | None = None
    results: Path | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PlannedRun:
    name: str  # its folder under the experiment's out
    overrides: list[str]  # every Hydra override of the run, its run_dir included


class Runs:
    """The planned runs after training: each one's folder and, once finished, its RunData (read once)."""

    def __init__(self, out: Path, planned: list[PlannedRun], failures: list[str], started: float):
        self.out, self.planned, self.failures, self.started = out, planned, failures, started
        self._read: dict[str, RunData | None] = {}

    def dir(self, name: str) -> Path:
        return self.out / name

    def get(self, name: str) -> RunData | None:
        """The finished run `name` (its summary written), None while it has not finished."""
        if name not in self._read:
            self._read[name] = finished_run(self.dir(name))
        return self._read[name]

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    @functools.cached_property
    def runs_wall_s(self) -> float:
        """The finished runs' own wall times, summed (they travel with each run in the ledger); read once, after
        training, for the report's title and its header."""
        return summed_wall(self.dir(r.name) for r in self.planned)


@dataclass
class Report:
    """What an experiment's report is: its markdown (starting with its `# title` line), the file name it has in
    the experiment's folder, the figures it links (file name -> a function drawing it into a path) and other files."""

    markdown: str
    name: str
    figures: dict[str, Callable[[Path], Any]] = field(default_factory=dict)  # published when the markdown links it
    files: dict[str, str] = field(default_factory=dict)
    suffix: str = ""  # of the published name when --results names a folder: <folder>/<out name><suffix>.md
    after: list[Callable[[], Any]] = field(default_factory=list)  # once it is published (tune: the tuned files)


class Experiment:
    """Base of every experiment; subclasses set `writer` and implement plan and report."""

    writer = "resfl"
    keep: dict[str, tuple[str, ...] | None] = {}  # what report reads beyond run_ledger.FILES (carried by the ledger)

    def __init__(self, grid_path: Path | str | None = None):
        self.grid_path = None if grid_path is None else Path(grid_path)

    def default_out(self, ctx: Context) -> Path:
        raise NotImplementedError

    def default_results(self, ctx: Context) -> Path | None:
        """Where the report is published when --results is not given (None: only into OUT)."""
        return None

    def plan(self, ctx: Context, out: Path) -> list[PlannedRun]:
        raise NotImplementedError

    def unpaired_plan(self, ctx: Context, out: Path, planned: list[PlannedRun]) -> list[str]:
        """Lines naming planned runs that would differ from their reference beyond what the experiment varies."""
        return []

    def unpaired_runs(self, ctx: Context, runs: Runs) -> list[str]:
        """Lines naming finished runs whose saved configs differ from their reference beyond what is varied."""
        return []

    def report(self, ctx: Context, runs: Runs) -> Report:
        raise NotImplementedError


def experiment_out(kind: str, ctx: Context, *tags: str) -> Path:
    """The one rule for where an experiment's runs live by default: runs/<kind>-<dataset>-<scenario>, then the
    values of the dataset.* overrides that are not paths (Adult's race and sex runs stay apart; a folder name cannot
    hold dataset.root), then the experiment's own tags (a robustness subset)."""
    values = [o.split("=", 1)[1] for o in ctx.overrides if o.startswith("dataset.") and "=" in o]
    values = [v for v in values if "/" not in v and "\\" not in v]
    return Path("runs") / "-".join([kind, *([ctx.dataset, ctx.scenario] if ctx.dataset else []), *values, *tags])


def results_path(results: Path, report: Report, out: Path) -> Path:
    """Where --results puts the report: the file itself when it names a .md file, else
    <results>/<out name><suffix>.md."""
    return results if results.suffix == ".md" else results / f"{out.name}{report.suffix}.md"


def _figure_names(report: Report, target: Path) -> dict[str, str]:
    """The figures the markdown links, each with its file name beside the published markdown: the markdown's stem,
    suffixed by the figure's own stem when it links more than one. A figure it does not link stays in OUT."""
    linked = [name for name in report.figures if f"]({name})" in report.markdown]
    if len(linked) == 1:
        return {linked[0]: target.stem + Path(linked[0]).suffix}
    return {name: f"{target.stem}-{Path(name).stem}{Path(name).suffix}" for name in linked}


def publish(report: Report, out: Path, ctx: Context, runs: Runs, writer: str) -> Path | None:
    """OUT/<name> (and its figures and files); with ctx.results also the published copy with its provenance."""
    import shutil

    from resfl_lightning.analysis.provenance import provenance_lines, write_with_provenance

    for name, text in report.files.items():
        (out / name).write_text(text)
    for name, draw in report.figures.items():
        draw(out / name)
    # one header for both copies: it reads every run's record and the ledger's chunks
    header = provenance_lines(ctx.command, runs.elapsed_s, runs.runs_wall_s, [runs.dir(r.name) for r in runs.planned])
    write_with_provenance(out / report.name, report.markdown, writer, header)
    results = ctx.results
    if results is None:
        return None
    target = results_path(results, report, out)
    body = report.markdown
    for name, published in _figure_names(report, target).items():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / name, target.parent / published)
        body = body.replace(f"]({name})", f"]({published})")
    return write_with_provenance(target, body, writer, header)


def execute(experiment: Experiment, ctx: Context) -> tuple[Path, Report]:
    """Plan, refuse stale or unpaired runs, train what is missing (ledger included), check what was trained, report
    and publish; raises ExperimentError after writing when a run failed. Returns (the experiment's folder, its
    report)."""
    from resfl_lightning.analysis import run_ledger
    from resfl_lightning.analysis.runner import run_jobs

    if ctx.jobs < 1:
        raise ExperimentError(f"--jobs must be >= 1, got {ctx.jobs}")
    started = time.perf_counter()
    out = ctx.out or experiment.default_out(ctx)
    unique: dict[str, PlannedRun] = {}
    for run in experiment.plan(ctx, out):  # a run two points share is planned by each, and trained once
        if unique.setdefault(run.name, run).overrides != run.overrides:
            raise ExperimentError(f"{type(experiment).__name__} planned two different runs into {out / run.name}")
    planned = list(unique.values())
    out.mkdir(parents=True, exist_ok=True)
    unpaired = experiment.unpaired_plan(ctx, out, planned)
    if unpaired:
        raise ExperimentError(f"{len(unpaired)} planned runs would differ from their reference beyond what the "
                              "experiment varies:\n" + "\n".join(unpaired))
    jobs = [(out / r.name, r.overrides) for r in planned]
    refuse_stale(jobs, out)
    run_ledger.keep(dict(experiment.keep))
    failures = run_jobs(jobs, ctx.jobs, stop_file=out / STOP_FILE)
    runs = Runs(out, planned, failures, started)
    unpaired = experiment.unpaired_runs(ctx, runs)
    if unpaired:
        raise ExperimentError(f"{len(unpaired)} finished runs in {out} were trained with other settings than their "
                              "reference beyond what the experiment varies; move them away and run again:\n"
                              + "\n".join(unpaired))
    report = experiment.report(ctx, runs)
    if ctx.results is None and (default := experiment.default_results(ctx)) is not None:
        ctx = dataclasses.replace(ctx, results=default)
    publish(report, out, ctx, runs, experiment.writer)
    for action in report.after:
        action()
    raise_failures(failures, len(planned), out)
    return out, report


def load_experiment(grid_path: Path | str) -> Experiment:
    """The experiment a grid file declares (its `_target_`), built with the file's path."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    target = OmegaConf.load(grid_path).get("_target_")
    if not target:
        raise ExperimentError(f"{grid_path}: no `_target_` naming its experiment class")
    cls = get_class(str(target))
    if not (isinstance(cls, type) and issubclass(cls, Experiment)):
        raise ExperimentError(f"{grid_path}: _target_ {target} is not an Experiment")
    return cls(grid_path)


def registered() -> dict[str, Path]:
    """Every grid file in conf/table/ that declares an experiment: its stem -> its path."""
    from omegaconf import OmegaConf

    from resfl_lightning.resources import conf_dir

    return {p.stem: p for p in sorted((conf_dir() / "table").glob("*.yaml"))
            if "_target_" in (OmegaConf.load(p) or {})}
