"""`resfl tune`: the equal tuning budget, so that no method wins by being tuned more. Every method gets the same number
of trials over its own pre-declared grid (conf/tune/<method>.yaml) on the tuning seeds of conf/table/tune.yaml (both
read by tune_grid.py), and the rule there (tune_rule.py) picks one trial per method on VALIDATION values only; the
selected trial's overrides go to conf/tuned/<dataset>/<method>.yaml (run_config/tuned.py), merged with a file already
there.

A method's tuning runs start from the tuned file it had when its tuning began (its "base"), frozen in OUT/bases.json:
a file this command writes later must not turn its own finished runs into stale ones. Runs are trained by
analysis/runner.py and resumable (a finished run is reused once its saved config is what its command composes to
now). Writes OUT/tune.md, OUT/selection.json and the trial log RESULTS
(docs/results/tune-<dataset>-<scenario>[-<preset>].md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from resfl_lightning.analysis import run_ledger
from resfl_lightning.analysis.execute import Context, Experiment, PlannedRun, Report, Runs, experiment_out
from resfl_lightning.analysis.run_data import finished_run
from resfl_lightning.analysis.run_settings import composed_settings, flatten
from resfl_lightning.analysis.table import algorithm_presets, table_preset
from resfl_lightning.analysis.tune_grid import (
    SCALE,
    SET_BY_TUNE,
    ExperimentError,
    TuneSettings,
    concrete,
    grid_file,
    load_grid,
    load_settings,
    reserved_seeds,
    trial_keys,
)
from resfl_lightning.analysis.tune_rule import (
    Selection,
    TrialValues,
    fairness_increase,
    fallback_label,
    learned_floor,
    mean_over,
    merged_tuned,
    select_trial,
    with_learned_floor,
)
from resfl_lightning.config.errors import ConfigError
from resfl_lightning.metrics.statistics import below_utility_floor
from resfl_lightning.resources import conf_dir
from resfl_lightning.run_config.tuned import (
    SWITCH,
    load_tuned,
    override_key,
    recorded_path,
    tuned_folder,
    with_tuned,
)


# --- the runs -------------------------------------------------------------------------------------------------------
def results_path(ctx: Context) -> Path:
    """docs/results/tune-<dataset>-<scenario>[-<dataset.* override values>][-<experiment preset>].md: the tune of one
    preset never overwrites another's trial log (the calibrated detection preset's wrote over the first preset's)."""
    preset = preset_experiment(ctx.dataset, ctx.overrides)
    return Path("docs") / "results" / (experiment_out("tune", ctx).name + (f"-{preset}" if preset else "") + ".md")


def run_dir_for(out: Path, method: str, trial: int, seed: int) -> Path:
    return out / f"{method}-t{trial}-s{seed}"


def common_overrides(dataset: str, scenario: str, method: str, user: list[str] = ()) -> list[str]:
    # attack=none: the rule reads no attack metric. use_tuned=false: the frozen base stands in for the tuned file.
    # eval.final_validation: the val/* metrics the rule selects on.
    return [f"dataset={dataset}", f"scenario={scenario}", *table_preset(dataset, user), f"algorithm={method}",
            "attack=none", "eval.final_validation=true", "logger=none", "progress=false", f"{SWITCH}=false"]


def run_overrides(dataset: str, scenario: str, method: str, seed: int, run_dir: Path, base: list[str],
                  trial: list[str], user: list[str]) -> list[str]:
    """One tuning run: the common overrides, the base (minus the keys the trial sets), the trial, then the user's."""
    keys = {override_key(o) for o in trial}
    kept = [o for o in base if override_key(o) not in keys]
    return [*common_overrides(dataset, scenario, method, user), f"seed={seed}", f"run_dir={run_dir}", *kept, *trial,
            *user]


def preset_experiment(dataset: str, user: list[str]) -> str | None:
    """The experiment preset a tuning run composes (the user's `experiment=`, else the dataset's table preset)."""
    chosen = [o.split("=", 1)[1] for o in [*table_preset(dataset, user), *user] if override_key(o) == "experiment"]
    return chosen[-1] if chosen else None


def frozen_bases(out: Path, dataset: str, methods: list[str], user: list[str]) -> dict[str, dict]:
    """method -> {"file", "overrides"}: the tuned file each method's runs start from, as it was when that method's
    tuning began here (OUT/bases.json; recorded now for a method tuned here for the first time). The active ledger
    carries the file with the runs: an OUT without it takes the ledger's, so that restored runs compose as they
    were trained (the tuned files they started from have since been rewritten by the tune itself)."""
    path, ledger_copy = out / "bases.json", run_ledger.carried(out, "bases.json")
    if not path.is_file() and ledger_copy is not None and ledger_copy.is_file():
        path.write_text(ledger_copy.read_text())
    bases = json.loads(path.read_text()) if path.is_file() else {}
    experiment = preset_experiment(dataset, user)
    for m in methods:
        if m not in bases:
            try:
                _, tuned, applied = with_tuned(user, {"dataset": dataset, "algorithm": m, "experiment": experiment})
            except ConfigError as err:
                raise ExperimentError(str(err)) from None
            bases[m] = {"file": None if tuned is None else recorded_path(tuned.path), "overrides": applied}
    text = json.dumps(bases, indent=1)
    path.write_text(text)
    if ledger_copy is not None:
        ledger_copy.parent.mkdir(parents=True, exist_ok=True)
        ledger_copy.write_text(text)
    return bases


def run_values(run_dir: Path, settings: TuneSettings) -> dict | None:
    """The rule's values of one finished run (None: it did not finish): validation utility, whether it is below the
    utility floor on validation (why, or None), the fairness metric and (DP methods) the largest epsilon a client
    spent."""
    run = finished_run(run_dir)  # analysis/run_data.py: the one reader
    if run is None:
        return None
    return {"task": run.task, "utility": run.value(settings.utility[run.task]),
            "below_floor": below_utility_floor(run.summary, settings.map50_floor, split="val"),
            "trivial": 0.0 if run.task == "detection" else run.value("val/majority_class_rate"),
            "fairness": run.value(settings.fairness_metric), "epsilon": run.value("dp/epsilon_max")}


@dataclass
class MethodTuning:
    """One method's tuning: its grid, base, the trials as run, every run's values and the rule's selection."""

    method: str
    grid: list[tuple[str, ...]]  # as declared
    trials: list[list[str]]  # as run (scaled values resolved)
    base: dict  # {"file", "overrides"}
    values: dict[int, dict[int, dict | None]]  # trial -> seed -> run_values
    selection: Selection
    max_increase: float | None
    outcome: str = ""  # what happened to the method's tuned file
    grid_file: str = ""  # the grid's path under conf/: tune/[<experiment>/]<method>.yaml ("": tune/<method>.yaml)

    def series(self, trial: int, key: str) -> dict[int, float | None]:
        return series(self.values[trial], key)

    def trial_values(self, trial: int) -> TrialValues:
        return trial_values(self.values, trial)

    @property
    def complete(self) -> bool:
        return all(v is not None for runs in self.values.values() for v in runs.values())


def series(runs: dict[int, dict | None], key: str) -> dict[int, float | None]:
    """seed -> the run's value of `key` (None: no finished run)."""
    return {s: (v or {}).get(key) for s, v in runs.items()}


def trial_values(values: dict[int, dict[int, dict | None]], trial: int) -> TrialValues:
    return TrialValues(trial, series(values[trial], "utility"), series(values[trial], "fairness"),
                       series(values[trial], "below_floor"), trivial=series(values[trial], "trivial"))


def preset_values(out: Path, method: str, seeds: list[int], settings: TuneSettings) -> TrialValues:
    """`method`'s trial 0 as run in OUT (a reference preset; runs not there have no values)."""
    values = trial_values({0: {s: run_values(run_dir_for(out, method, 0, s), settings) for s in seeds}}, 0)
    return replace(values, method=method)


@dataclass(frozen=True)
class References:
    """The presets a selection reads besides the method's own trials (None: not used by the rule)."""

    learned: TrialValues | None = None  # the learned floor's yardstick (rule version 3)
    fairness: TrialValues | None = None  # the fairness reference's fallback, with the learned floor applied

    @classmethod
    def read(cls, out: Path, seeds: list[int], settings: TuneSettings) -> References:
        learned = (None if settings.learned_reference is None
                   else preset_values(out, settings.learned_reference, seeds, settings))
        fallback = (learned if learned is not None and learned.method == settings.reference_fallback
                    else preset_values(out, settings.reference_fallback, seeds, settings))  # FedAvg's, read once
        return cls(learned, floored(fallback, learned, settings))


def floored(trial: TrialValues, learned: TrialValues | None, settings: TuneSettings) -> TrialValues:
    """The trial with the learned floor of rule version 3 applied (unchanged before it)."""
    return trial if learned is None else with_learned_floor(trial, learned, settings.learned_fraction)


def tune_method(method: str, grid: list[tuple[str, ...]], trials: list[list[str]], base: dict, out: Path,
                seeds: list[int], settings: TuneSettings, references: References = References(),
                grid_path: str | None = None) -> MethodTuning:
    """The method's finished runs and the rule's selection among its trials (`references`: the presets the rule
    compares with, `References.read`; `grid_path`: the grid's path under conf/, default tune/<method>.yaml)."""
    values = {t: {s: run_values(run_dir_for(out, method, t, s), settings) for s in seeds} for t in range(len(grid))}
    limit = settings.max_increase_for(method)
    candidates = [floored(trial_values(values, t), references.learned, settings) for t in values]
    selection = select_trial(candidates, seeds, limit, references.fairness)
    return MethodTuning(method, grid, trials, base, values, selection, limit,
                        grid_file=grid_path or f"tune/{method}.yaml")


# --- the outputs ----------------------------------------------------------------------------------------------------
def _num(v: float | None, digits: int = 4) -> str:
    return "n/a" if v is None or not math.isfinite(v) else f"{v:.{digits}f}"


def _trial_text(declared: tuple[str, ...], run: list[str]) -> str:
    if not declared:
        return "(the preset)"
    return ", ".join(f"`{r}`" + (f" ({d})" if d != r else "") for d, r in zip(declared, run))


def method_lines(t: MethodTuning, seeds: list[int], utility_name: str) -> list[str]:
    base = (f"{t.base['file']} ({', '.join(f'`{o}`' for o in t.base['overrides'])})" if t.base["overrides"]
            else "none (the preset as written)")
    constrained = t.max_increase is not None
    dp = any((v or {}).get("epsilon") is not None for runs in t.values.values() for v in runs.values())
    reference = t.selection.reference
    extra = (["val Fairness Score (Δ vs reference)"] if constrained else []) + (["ε spent (max)"] if dp else [])
    grid = t.grid_file or f"tune/{t.method}.yaml"
    lines = [f"## {t.method}", "", f"Grid: conf/{grid}. Base (applied to every trial): {base}.", "",
             "| trial | overrides | " + " | ".join(f"seed {s}" for s in seeds) + f" | mean val {utility_name} | "
             + "".join(f"{h} | " for h in extra) + "verdict |",
             "| ---: | --- |" + " ---: |" * (len(seeds) + 1 + len(extra)) + " --- |"]
    for i, (declared, run) in enumerate(zip(t.grid, t.trials)):
        util = t.series(i, "utility")
        cells = [_num(util.get(s)) for s in seeds] + [_num(mean_over(util, seeds))]
        if constrained:
            fair = mean_over(t.series(i, "fairness"), seeds)
            increase = math.nan if reference is None else fairness_increase(t.trial_values(i), reference)
            cells.append(f"{_num(fair)} ({increase:+.4f})" if math.isfinite(increase) else _num(fair))
        if dp:
            eps = [e for e in t.series(i, "epsilon").values() if e is not None]
            cells.append(_num(max(eps), 3) if eps else "n/a")
        verdict = t.selection.verdicts.get(i, "")
        mark = "**selected**" if t.selection.selected == i else verdict
        lines.append(f"| {i} | {_trial_text(declared, run)} | " + " | ".join(cells) + f" | {mark} |")
    if constrained:
        ref = ("none (neither trial 0 nor the fallback preset learned with a validation Fairness Score on a tuning "
               "seed)" if reference is None else
               f"{reference.label} on seeds {sorted(reference.fairness)} (mean "
               f"{mean_over(reference.fairness, sorted(reference.fairness)):.4f})")
        lines += ["", f"Fairness reference: {ref}."]
    return [*lines, "", f"**Selection:** {t.selection.reason}. {t.outcome}", ""]


def learned_floor_line(learned: TrialValues, fraction: float, seeds: list[int]) -> str:
    """Rule version 3's floor per seed, as the trial log states it."""
    cells = []
    for s in seeds:
        floor = learned_floor(learned.utility.get(s), learned.trivial.get(s), fraction)
        cells.append(f"seed {s}: {floor:.4f}" if floor is not None
                     else f"seed {s}: the table's floor alone ({fallback_label(learned)} has no gain there)")
    return (f"Learned floor (a trial must reach it on every tuning seed): a constant prediction's validation utility "
            f"plus {fraction:g} x the gain of {fallback_label(learned)} over it; " + ", ".join(cells) + ".")


def tune_markdown(header: str, settings: TuneSettings, tunings: list[MethodTuning], seeds: list[int], task: str,
                  failures: list[str], learned: TrialValues | None = None) -> str:
    name = "mAP@50" if task == "detection" else "accuracy"
    lines = [header, "", "The budget and the selection rule, as pre-registered (conf/table/tune.yaml):", "", "```yaml",
             settings.text.rstrip(), "```", "",
             f"Per trial: the validation {name} of each tuning seed's run (the global model's final evaluation on the "
             "union of the clients' validation splits; the test split is never read), their mean, the constraint "
             "values and the rule's verdict. Scaled grid values (`key*=f`) are shown as run, the grid's entry in "
             "brackets.", ""]
    if learned is not None and settings.learned_fraction is not None:
        lines += [learned_floor_line(learned, settings.learned_fraction, seeds), ""]
    if len(seeds) == 1:
        lines += [f"One tuning seed ({seeds[0]}): \"learned on every tuning seed\" is a single-seed check and the mean "
                  "is one run's value.", ""]
    for t in tunings:
        lines += method_lines(t, seeds, name)
    if failures:
        lines += ["Failed runs (re-run the same command to retry them):", "", *[f"- {f}" for f in failures], ""]
    return "\n".join(lines)


def tuned_text(merged: dict, header: list[str], note: str) -> str:
    comments = header if note in header else [*header, note]
    return "\n".join([*comments, yaml.safe_dump(merged, sort_keys=False, width=4096).rstrip()]) + "\n"


def leading_comments(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return lines


def plan_tuned_file(t: MethodTuning, target: Path, repository_file: Path, command: str, evidence: str,
                    seeds: list[int]) -> str | None:
    """The text to write to `target` (None: nothing to write), and t.outcome saying what happens. Merges with the
    file at `target`, else with the repository's file for the same dataset (or preset) and method."""
    if not t.complete or t.selection.selected is None:
        t.outcome = ("Tuned file: not written (runs missing; re-run the same command to complete them)." if not
                     t.complete else "Tuned file: not written (nothing selected).")
        return None
    existing_path = next((p for p in (target, repository_file) if p.is_file()), None)
    existing = None if existing_path is None else yaml.safe_load(existing_path.read_text())
    i = t.selection.selected
    merged = merged_tuned(existing, t.trials[i], command, evidence, base=t.base["overrides"])
    if merged is None:
        t.outcome = ("Trial 0 (the preset) selected and no tuned file existed: none written." if existing is None else
                     f"Trial 0 (the preset as written) selected, but the trials did not start from "
                     f"{recorded_path(existing_path)}: it is left as it was, and is not what they selected.")
        return None
    grid = t.grid_file or f"tune/{t.method}.yaml"  # a preset's or dataset's own grid (conf/tune/<scope>/) named
    note = (f"# `resfl tune` (conf/table/tune.yaml, grid conf/{grid}, seeds {seeds}): trial {i}"
            + (f" ({' '.join(t.trials[i])})" if t.trials[i] else " (the tuning base kept)") + ".")
    where = "merged into" if existing is not None else "written to"
    t.outcome = f"Tuned file {where} {recorded_path(target)}: overrides {', '.join(merged['overrides'])}."
    return tuned_text(merged, leading_comments(existing_path.read_text()) if existing_path else [], note)


def write_tuned_file(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    try:
        load_tuned(target)  # what `resfl train` will load: checked now
    except ConfigError as err:
        raise ExperimentError(str(err)) from None


def selection_record(t: MethodTuning) -> dict:
    i = t.selection.selected
    return {"selected": i, "overrides": None if i is None else t.trials[i], "reason": t.selection.reason,
            "outcome": t.outcome}


# --- the command ----------------------------------------------------------------------------------------------------
def checked_seeds(seeds: list[int]) -> list[int]:
    taken = sorted(set(seeds) & reserved_seeds())
    if taken or not seeds or len(set(seeds)) != len(seeds):
        raise ExperimentError(f"tuning seeds {seeds}: distinct seeds none of which a table or the frontier uses "
                        f"(taken: {taken})")
    return seeds


def trials_as_run(grid: list[tuple[str, ...]], composed_from: list[str]) -> list[list[str]]:
    """The grid's trials with scaled entries resolved against the config `composed_from` composes to (composed
    only when the grid scales something)."""
    scaled = any(SCALE in o for trial in grid for o in trial)
    values = flatten(composed_settings(composed_from)) if scaled else {}
    return [concrete(trial, values) for trial in grid]


def check_user_overrides(user: list[str], grids: dict[str, list[tuple[str, ...]]]) -> None:
    own = {override_key(o) for o in user}
    fixed = sorted(own & set(SET_BY_TUNE) - {SWITCH})
    if fixed:
        raise ExperimentError(f"overrides: {fixed} are set by every tuning run (--methods, --seeds choose them)")
    for m, grid in grids.items():
        clash = sorted(own & set().union(*map(trial_keys, grid)))
        if clash:
            raise ExperimentError(f"overrides: {clash} are tuned by {m}'s grid (conf/tune/); fixing them would "
                                  "leave its trials unequal")


class Tune(Experiment):
    """The equal tuning budget of conf/table/tune.yaml (ctx.options: methods, seeds, trials, tuned_dir): every
    method's trials x tuning seeds (and the rule's reference presets), then tune.md, selection.json, the trial log
    (published by default as docs/results/tune-<dataset>-<scenario>[-<preset>].md) and the tuned files it selects."""

    writer = "resfl tune"

    def setup(self, ctx: Context, out: Path) -> dict:
        settings = load_settings()
        presets = algorithm_presets()
        methods = ctx.options.get("methods") or presets
        unknown = [m for m in methods if m not in presets]
        if unknown:
            raise ExperimentError(f"--methods: unknown {unknown}; choose from {', '.join(presets)}")
        seeds = ctx.options.get("seeds")
        seeds = checked_seeds(list(settings.seeds_for(ctx.dataset) if seeds is None else seeds))
        k = settings.trials if ctx.options.get("trials") is None else ctx.options["trials"]
        if not 1 <= k <= settings.trials:
            raise ExperimentError(f"--trials must lie in 1..{settings.trials} (the first k of every grid), got {k}")
        user = [o for o in ctx.overrides if override_key(o) != SWITCH]  # use_tuned=false: no base (frozen_bases)
        scope = preset_experiment(ctx.dataset, ctx.overrides) or ctx.dataset  # conf/tune/<scope>/: its own grids
        grids = {m: load_grid(m, settings, experiment=scope)[:k] for m in methods}
        grid_files = {m: grid_file(m, scope).relative_to(conf_dir()).as_posix() for m in methods}
        check_user_overrides(ctx.overrides, grids)
        out.mkdir(parents=True, exist_ok=True)
        # the reference presets run too (trial 0 only) when their method is not tuned here
        reference_only = [m for m in settings.reference_methods(methods) if m not in methods]
        bases = frozen_bases(out, ctx.dataset, [*methods, *reference_only], ctx.overrides)
        run_trials = {m: trials_as_run(grids[m], [*common_overrides(ctx.dataset, ctx.scenario, m, user),
                                                  *bases[m]["overrides"], *user]) for m in methods}
        run_trials |= {m: [[]] for m in reference_only}
        return {"settings": settings, "methods": methods, "seeds": seeds, "k": k, "user": user, "grids": grids,
                "reference_only": reference_only, "bases": bases, "run_trials": run_trials,
                "grid_files": grid_files}

    def default_out(self, ctx: Context) -> Path:
        return experiment_out("tune", ctx)

    def default_results(self, ctx: Context) -> Path:
        return results_path(ctx)

    def plan(self, ctx: Context, out: Path) -> list[PlannedRun]:
        t = self.setup(ctx, out)
        return [PlannedRun(run_dir_for(out, m, i, s).name,
                           run_overrides(ctx.dataset, ctx.scenario, m, s, run_dir_for(out, m, i, s),
                                         t["bases"][m]["overrides"], t["run_trials"][m][i], t["user"]))
                for s in t["seeds"] for m in [*t["methods"], *t["reference_only"]]
                for i in range(len(t["run_trials"][m]))]

    def report(self, ctx: Context, runs: Runs) -> Report:
        out = runs.out
        t = self.setup(ctx, out)
        settings, methods, seeds, k = t["settings"], t["methods"], t["seeds"], t["k"]
        references = References.read(out, seeds, settings)  # read once, for every method
        tunings = [tune_method(m, t["grids"][m], t["run_trials"][m], t["bases"][m], out, seeds, settings,
                               references, t["grid_files"][m]) for m in methods]
        tasks = {v["task"] for tu in tunings for vs in tu.values.values() for v in vs.values() if v is not None}
        task = tasks.pop() if len(tasks) == 1 else "classification"
        experiment = preset_experiment(ctx.dataset, ctx.overrides)
        folder = tuned_folder(ctx.dataset, experiment, ctx.options.get("tuned_dir") or conf_dir() / "tuned")
        repository = tuned_folder(ctx.dataset, experiment)
        evidence = recorded_path(ctx.results or self.default_results(ctx))
        planned = {tu.method: plan_tuned_file(tu, folder / f"{tu.method}.yaml", repository / f"{tu.method}.yaml",
                                              ctx.command, evidence, seeds) for tu in tunings}
        budget = f"{k} trials" if k == settings.trials else f"the first {k} of {settings.trials} trials"
        reference_only = t["reference_only"]
        reference_runs = (f", plus {' and '.join(reference_only)}'s preset as the rule's reference" if reference_only
                          else "")
        header = (f"# Tuning budget: {ctx.dataset}, scenario {ctx.scenario} ({len(methods)} methods x {budget} x "
                  f"{len(seeds)} tuning seeds {seeds}{reference_runs}; {len(runs.planned)} runs; selection rule "
                  f"version {settings.version}; this invocation took {runs.elapsed_s:.0f} s with --jobs {ctx.jobs}; "
                  f"the runs' own wall times sum to {runs.runs_wall_s:.0f} s)")
        text = tune_markdown(header, settings, tunings, seeds, task, runs.failures, references.learned)
        selection = json.dumps({tu.method: selection_record(tu) for tu in tunings}, indent=1)
        writes = [lambda m=m, text=text: write_tuned_file(folder / f"{m}.yaml", text)
                  for m, text in planned.items() if text is not None]
        return Report(text, "tune.md", files={"selection.json": selection}, after=writes)
