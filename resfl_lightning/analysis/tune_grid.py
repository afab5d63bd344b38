"""`resfl tune`'s budget and grids: conf/table/tune.yaml (trials, tuning seeds, fixed keys, the rule's metrics) and
conf/tune/<method>.yaml (the method's trials, trial 0 the preset), checked so that every method gets the same number
of trials and no grid moves what must stay fixed; `key*=f` entries scale the value the run would otherwise have."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.frontier import load_grid as load_frontier_grid
from resfl_lightning.analysis.statistics import load_statistics
from resfl_lightning.analysis.table import algorithm_presets
from resfl_lightning.resources import conf_dir
from resfl_lightning.run_config.tuned import RECORD, SWITCH, override_key
from resfl_lightning.values import finite

SCALE = "*="  # `key*=f` in a grid: f times the value the run would have without the trial
SET_BY_TUNE = ("algorithm", "seed", "run_dir", SWITCH, RECORD)  # keys each tuning run's command sets itself


@dataclass(frozen=True)
class TuneSettings:
    trials: int  # every method's budget
    seeds: tuple[int, ...]
    fixed: tuple[str, ...]  # keys no grid may set (nor any key under them)
    utility: dict[str, str]  # task -> summary.json key
    fairness_metric: str
    max_increase: float
    fairness_methods: tuple[str, ...]
    reference_fallback: str  # the method whose trial 0 is the fairness reference where a preset has none
    map50_floor: float  # the table's utility floor (conf/table/statistics.yaml), applied to validation
    version: int  # rule_version: which rule a trial log was selected by
    text: str  # the file as written (quoted in the trial log)
    seeds_by_dataset: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a dataset's own tuning seeds, where declared
    learned_reference: str | None = None  # rule version 3's floor: this method's preset is the yardstick ...
    learned_fraction: float | None = None  # ... of which a trial must reach this fraction of the gain (None: off)

    def reference_methods(self, methods: list[str]) -> list[str]:
        """The presets `methods`' selection reads besides their own trials: the learned floor's reference, and the
        fairness fallback where a constrained method is tuned."""
        needed = [self.learned_reference] if self.learned_reference else []
        if any(self.max_increase_for(m) is not None for m in methods):
            needed.append(self.reference_fallback)
        return list(dict.fromkeys(needed))

    def max_increase_for(self, method: str) -> float | None:
        return self.max_increase if method in self.fairness_methods else None

    def seeds_for(self, dataset: str) -> tuple[int, ...]:
        """`dataset`'s tuning seeds: its entry of tuning_seeds_by_dataset, else tuning_seeds."""
        return dict(self.seeds_by_dataset).get(dataset, self.seeds)


def settings_file() -> Path:
    return conf_dir() / "table" / "tune.yaml"


def load_settings(path: Path | None = None) -> TuneSettings:
    path = Path(path or settings_file())
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    try:
        rule = raw["rule"]
        settings = TuneSettings(int(raw["trials"]), tuple(int(s) for s in raw["tuning_seeds"]),
                                tuple(str(k) for k in raw["fixed"]),
                                {str(k): str(v) for k, v in rule["utility"].items()}, str(rule["fairness"]["metric"]),
                                float(rule["fairness"]["max_increase"]),
                                tuple(str(m) for m in rule["fairness"]["methods"]),
                                str(rule["fairness"]["reference_fallback"]), load_statistics().map50_floor,
                                int(raw.get("rule_version", 1)), path.read_text(),
                                tuple((str(d), tuple(int(s) for s in seeds))
                                      for d, seeds in (raw.get("tuning_seeds_by_dataset") or {}).items()))
        learned = rule.get("learned")
        if learned is not None:
            settings = replace(settings, learned_reference=str(learned["reference"]),
                               learned_fraction=float(learned["fraction"]))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ExperimentError(f"{path}: missing or malformed key {err}") from None
    if settings.learned_fraction is not None and not 0 < settings.learned_fraction <= 1:
        raise ExperimentError(f"{path}: rule.learned.fraction must lie in (0, 1], got {settings.learned_fraction}")
    if settings.trials < 1 or not settings.seeds or not all(seeds for _, seeds in settings.seeds_by_dataset):
        raise ExperimentError(f"{path}: trials must be >= 1 and tuning_seeds (and each tuning_seeds_by_dataset entry) "
                        "non-empty")
    named = set(settings.fairness_methods) | {settings.reference_fallback} | {settings.learned_reference} - {None}
    unknown = sorted(named - set(algorithm_presets()))
    if unknown:
        raise ExperimentError(f"{path}: rule.fairness.methods / reference_fallback / learned.reference: no "
                              "conf/algorithm/ "
                        f"preset {unknown}")
    return settings


def reserved_seeds() -> set[int]:
    """The seeds of the tables (0 .. the largest seed count of conf/table/statistics.yaml) and of the adversary
    frontier (its tuning and confirmation seeds): tuning on them would select on the numbers it is judged by."""
    frontier = load_frontier_grid()
    table = max(primary for _, primary in load_statistics().seeds.values())
    by_dataset = set().union(*map(set, frontier.tuning_seeds_by_dataset.values()))
    return set(range(table)) | set(frontier.tuning_seeds) | by_dataset | set(frontier.confirmation_seeds)


def grid_file(method: str, experiment: str | None = None, root: Path | None = None) -> Path:
    """conf/tune/<experiment>/<method>.yaml when the experiment preset declares its own grid for the method (a
    range that depends on the preset's scale, such as DP-SGD's lr x C against its gradient norms), else
    conf/tune/<method>.yaml. `experiment` is the tune's grid scope (analysis/tune.py: the preset, or the dataset
    when it has none, as conf/tune/adult/). `root`: conf/tune/."""
    root = root if root is not None else conf_dir() / "tune"
    own = root / experiment / f"{method}.yaml" if experiment else None
    return own if own is not None and own.is_file() else root / f"{method}.yaml"


def item_key(item: str) -> str:
    """The key a grid entry sets: `a.b=1` and `a.b*=3` both set a.b."""
    return override_key(item.replace(SCALE, "=", 1))


def scale_factor(item: str) -> float:
    """f of `key*=f` (a number or a fraction such as 1/3); ValueError unless positive."""
    try:
        factor = float(Fraction(item.split(SCALE, 1)[1].strip()))
    except (ValueError, ZeroDivisionError):
        factor = math.nan
    if not factor > 0:
        raise ValueError(f"{item!r}: the factor must be a positive number or fraction (1/3)")
    return factor


def _check_item(path: Path, where: str, item, fixed: tuple[str, ...]) -> str:
    if not isinstance(item, str) or "=" not in item:
        raise ExperimentError(f"{path}: {where}: expected key=value or key*=factor, got {item!r}")
    key = item_key(item)
    if key in SET_BY_TUNE or any(key == f or key.startswith(f + ".") for f in fixed):
        raise ExperimentError(f"{path}: {where}: {key} is fixed (conf/table/tune.yaml `fixed`, or set by every "
                              "tuning run)")
    if SCALE in item:
        try:
            scale_factor(item)
        except ValueError as err:
            raise ExperimentError(f"{path}: {where}: {err}") from None
    return key


def load_grid(method: str, settings: TuneSettings, path: Path | None = None,
              experiment: str | None = None) -> list[tuple[str, ...]]:
    """The method's trials as declared (`key*=f` unresolved), checked against the budget: exactly settings.trials
    trials, trial 0 empty (the preset), no trial twice, no key set twice in a trial, no fixed key."""
    path = Path(path or grid_file(method, experiment))
    if not path.is_file():
        raise ExperimentError(f"{path}: no grid for {method}: every method needs one (conf/tune/<method>.yaml)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ExperimentError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(raw, dict) or set(raw) != {"trials"} or not isinstance(raw["trials"], list):
        raise ExperimentError(f"{path}: expected a mapping with one key, `trials`: a list of override lists")
    trials = raw["trials"]
    if len(trials) != settings.trials:
        raise ExperimentError(f"{path}: {len(trials)} trials, but the budget is {settings.trials} "
                              "(conf/table/tune.yaml "
                        "`trials`): every method gets the same number")
    if trials[0] != []:
        raise ExperimentError(f"{path}: trials[0] must be [] (the untuned preset), got {trials[0]!r}")
    out: list[tuple[str, ...]] = []
    for i, trial in enumerate(trials):
        if not isinstance(trial, list):
            raise ExperimentError(f"{path}: trials[{i}]: expected a list of overrides, got {trial!r}")
        keys = [_check_item(path, f"trials[{i}][{j}]", item, settings.fixed) for j, item in enumerate(trial)]
        if len(set(keys)) != len(keys):
            raise ExperimentError(f"{path}: trials[{i}]: a key is set twice ({keys})")
        if tuple(trial) in out:
            raise ExperimentError(f"{path}: trials[{i}] repeats trials[{out.index(tuple(trial))}]")
        out.append(tuple(trial))
    return out


def trial_keys(trial: tuple[str, ...]) -> set[str]:
    return {item_key(o) for o in trial}


def concrete(trial: tuple[str, ...], base: dict) -> list[str]:
    """The trial's overrides with every `key*=f` replaced by key=f x base[key] (base: the run's flattened settings
    without the trial)."""
    out = []
    for item in trial:
        if SCALE not in item:
            out.append(item)
            continue
        key = item_key(item)
        value = finite(base.get(key))
        if value is None:
            raise ExperimentError(f"{item!r}: {key} is {base.get(key)!r} in the composed config, not a number to scale")
        out.append(f"{key}={value * scale_factor(item):.6g}")
    return out
