"""conf/table/tune.yaml and conf/tune/<method>.yaml: the registered budget and rule, every shipped grid loads with
the same trial count and trial 0 empty, and a grid that breaks the budget is refused naming its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from resfl_lightning.analysis.run_settings import composed_settings, flatten
from resfl_lightning.analysis.table import algorithm_presets
from resfl_lightning.analysis.tune import common_overrides
from resfl_lightning.analysis.tune_grid import (
    SCALE,
    ExperimentError,
    concrete,
    grid_file,
    load_grid,
    load_settings,
    reserved_seeds,
    trial_keys,
)
from resfl_lightning.resources import conf_dir


def test_the_registered_budget_and_rule():
    s = load_settings()
    assert s.trials == 8 and s.seeds == (126, 127, 128) and s.version == 3  # versions 1, 2: 120-122, 123-125
    assert not set(s.seeds) & reserved_seeds()
    assert set(range(10)) | set(range(100, 105)) | set(range(130, 140)) <= reserved_seeds()
    assert s.utility == {"classification": "val/accuracy", "detection": "val/map_50"}
    assert s.fairness_metric == "val/fairness_score" and s.max_increase == 0.02
    assert s.reference_fallback == "fedavg" and s.map50_floor == 0.05  # the table's floor
    assert s.learned_reference == "fedavg" and s.learned_fraction == 0.5
    assert "algorithm.dp.target_epsilon" in s.fixed and "federation.rounds" in s.fixed
    assert {"resfl", "fairfed", "puffle"} <= set(s.fairness_methods) and "fedavg" not in s.fairness_methods


def test_every_preset_has_a_grid_of_the_budget_with_the_preset_first():
    s = load_settings()
    presets = algorithm_presets()
    assert sorted(p.stem for p in (conf_dir() / "tune").glob("*.yaml")) == sorted(presets)
    for method in presets:
        grid = load_grid(method, s)
        assert len(grid) == s.trials and grid[0] == (), method
        assert len(set(grid)) == len(grid), method
        assert (conf_dir() / "tune" / f"{method}.yaml").read_text().startswith("#"), f"{method}: no header comment"


def preset_grids() -> list[tuple[str, str]]:
    """(scope, method) of every grid an experiment preset, or a dataset without one, declares for itself:
    conf/tune/<scope>/."""
    return [(d.name, p.stem) for d in sorted((conf_dir() / "tune").iterdir()) if d.is_dir()
            for p in sorted(d.glob("*.yaml"))]


def test_an_experiment_preset_may_declare_its_own_grid_for_a_method(tmp_path: Path):
    (tmp_path / "exp").mkdir()
    for path in (tmp_path / "m.yaml", tmp_path / "exp" / "m.yaml"):
        path.write_text("trials: []\n")
    assert grid_file("m", "exp", tmp_path) == tmp_path / "exp" / "m.yaml"
    assert grid_file("other", "exp", tmp_path) == tmp_path / "other.yaml"  # no own grid: the method's
    assert grid_file("m", "another", tmp_path) == grid_file("m", None, tmp_path) == tmp_path / "m.yaml"


def scope_overrides(scope: str) -> list[str]:
    """The dataset and preset overrides a tune of this grid scope composes (a dataset scope: no preset)."""
    if (conf_dir() / "dataset" / f"{scope}.yaml").is_file():
        assert not (conf_dir() / "experiment" / f"table_{scope}.yaml").is_file(), f"{scope} has a table preset"
        return [f"dataset={scope}"]
    assert (conf_dir() / "experiment" / f"{scope}.yaml").is_file(), f"conf/tune/{scope}/: no such preset or dataset"
    return ["dataset=synthetic", f"experiment={scope}"]


def test_every_preset_grid_belongs_to_an_experiment_and_a_method_and_keeps_the_budget():
    """The calibrated detection preset declares DP-SGD's lr x C grids and CurvFed's of its own
    (conf/tune/table_synthetic/), and Adult (no preset) PUFFLE's and CurvFed's post hoc grids (conf/tune/adult/); each
    is what a tune of that scope loads, has the budget and a header, and sets keys of the method's config."""
    s, presets = load_settings(), algorithm_presets()
    assert {m for e, m in preset_grids() if e == "table_synthetic"} == {"curvfed", "fedavg_dp", "pfu_fl",
                                                                         "puffle", "puffle_resfl"}
    assert {m for e, m in preset_grids() if e == "adult"} == {"curvfed", "puffle"}
    for scope, method in preset_grids():
        path = conf_dir() / "tune" / scope / f"{method}.yaml"
        assert method in presets, path
        assert grid_file(method, scope) == path and path.read_text().startswith("#"), path
        grid = load_grid(method, s, experiment=scope)
        assert len(grid) == s.trials and grid[0] == () and grid != load_grid(method, s), path
        dataset = scope_overrides(scope)[0].split("=", 1)[1]
        settings = flatten(composed_settings([*common_overrides(dataset, "group_skew", method),
                                              *scope_overrides(scope)[1:]]))
        for trial in grid:
            assert trial_keys(trial) <= set(settings), f"{path}: {trial_keys(trial) - set(settings)}"
            assert not any(SCALE in o for o in concrete(trial, settings))


def test_every_grid_key_exists_and_every_scaled_value_resolves():
    """One composition per method (adult): each key a trial sets is a key of that method's config."""
    s = load_settings()
    for method in algorithm_presets():
        grid = load_grid(method, s)
        settings = flatten(composed_settings([*common_overrides("adult", "iid", method)]))
        for trial in grid:
            for key in trial_keys(trial):
                assert key in settings, f"conf/tune/{method}.yaml: {key} is no key of {method}'s config"
            resolved = concrete(trial, settings)
            assert not any(SCALE in o for o in resolved)


@pytest.mark.parametrize("content, match", [
    ("trials:\n  - []\n  - [optim.lr=0.1]\n", r"2 trials, but the budget is 8"),
    ("trials:\n" + "".join(f"  - [optim.lr={i}]\n" for i in range(8)), r"trials\[0\] must be \[\]"),
    ("trials:\n  - []\n" + "".join(f"  - [algorithm.dp.target_epsilon={i}]\n" for i in range(7)),
     "algorithm.dp.target_epsilon is fixed"),
    ("trials:\n  - []\n" + "".join(f"  - [dataset.num_clients={i}]\n" for i in range(7)),
     "dataset.num_clients is fixed"),
    ("trials:\n  - []\n" + "".join(f"  - [algorithm=fedavg, optim.lr={i}]\n" for i in range(7)), "algorithm is fixed"),
    ("trials:\n  - []\n" + "".join(f"  - [optim.lr*={i}]\n" for i in range(7)), "positive number or fraction"),
    ("trials:\n  - []\n" + "".join(f"  - [optim.lr={i}, optim.lr*=2]\n" for i in range(7)), "set twice"),
    ("trials:\n  - []\n" + "  - [optim.lr=1]\n" * 7, r"trials\[2\] repeats trials\[1\]"),
    ("trials:\n  - []\n" + "".join(f"  - [justakey{i}]\n" for i in range(7)), "expected key=value"),
    ("grid: {optim.lr: [1, 2]}\n", "one key, `trials`"),
])
def test_a_grid_that_breaks_the_budget_is_refused_naming_its_file(tmp_path: Path, content, match):
    path = tmp_path / "m.yaml"
    path.write_text(content)
    with pytest.raises(ExperimentError, match=match) as err:
        load_grid("m", load_settings(), path)
    assert str(path) in str(err.value)


def test_a_missing_grid_names_the_method(tmp_path: Path):
    with pytest.raises(ExperimentError, match="no grid for nothere"):
        load_grid("nothere", load_settings(), tmp_path / "nothere.yaml")


def test_scaled_values_multiply_the_composed_value():
    base = {"optim.lr": 0.01, "algorithm.dp.max_grad_norm": 1.0}
    assert concrete(("optim.lr*=1/3", "algorithm.dp.max_grad_norm=0.1"), base) == \
        ["optim.lr=0.00333333", "algorithm.dp.max_grad_norm=0.1"]
    assert concrete(("optim.lr*=10",), base) == ["optim.lr=0.1"]
    with pytest.raises(ExperimentError, match="not a number to scale"):
        concrete(("optim.momentum*=2",), base)


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["adult", "synthetic"])
def test_every_trial_of_every_grid_passes_the_config_rules(dataset):
    """A trial the schema or a cross-key rule refuses (e.g. PUFFLE's tunable lambda under DP without a lambda share of
    epsilon) would fail all of its tuning runs; each method's method-specific trials compose and load here."""
    from resfl_lightning.run_config.load import load_config

    s = load_settings()
    for method in algorithm_presets():
        base = [*common_overrides(dataset, "iid", method)]
        settings = flatten(composed_settings(base))
        for trial in load_grid(method, s)[3:]:  # trials 1-2 are every grid's shared optimiser axis
            load_config(composed_settings([*base, *concrete(trial, settings)]))
    for scope, method in preset_grids():  # each scope's own grids, on the dataset it belongs to
        if scope_overrides(scope)[0] != f"dataset={dataset}":
            continue
        base = [*common_overrides(dataset, "iid", method), *scope_overrides(scope)[1:]]
        settings = flatten(composed_settings(base))
        for trial in load_grid(method, s, experiment=scope)[1:]:
            load_config(composed_settings([*base, *concrete(trial, settings)]))
