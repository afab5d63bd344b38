"""`resfl frontier`: the pre-registered selection rule on hand-made numbers, the grid file, each run's composed
settings, and (slow) the command end to end on a tiny grid."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from resfl_lightning.analysis.frontier import Point, grid_points, load_grid, run_overrides
from resfl_lightning.analysis.frontier_rule import PointSummary, select_point, utility_floor


def point(strength: str, lam: float, aia: float, utility: float = 0.85, upper: float = -0.01) -> PointSummary:
    return PointSummary(strength, lam, {"weak": 0, "strong": 1}[strength], aia, utility, upper)


def test_utility_floor_per_task():
    assert utility_floor("classification", 0.850, 0.005, 0.98) == pytest.approx(0.845)
    assert utility_floor("detection", 0.50, 0.005, 0.98) == pytest.approx(0.49)
    with pytest.raises(ValueError, match="task"):
        utility_floor("regression", 0.5, 0.005, 0.98)


def test_the_utility_constraint_excludes_a_point_with_better_aia_but_worse_utility():
    cheap = point("strong", 1.0, aia=0.60, utility=0.838)  # the lowest AIA, but 0.838 < 0.845
    good = point("strong", 0.3, aia=0.70, utility=0.846)
    weak = point("weak", 0.1, aia=0.85, utility=0.851)
    sel = select_point([weak, good, cheap], floor=0.845)
    assert sel.selected == good
    assert sel.verdicts[cheap.name].startswith("excluded: utility 0.8380 < floor 0.8450")
    assert sel.verdicts[weak.name] == "feasible"


def test_the_fairness_constraint_excludes_a_worse_or_undetermined_fairness_score():
    unfair = point("strong", 1.0, aia=0.60, upper=0.004)  # upper end of (candidate - default) above 0
    unknown = point("strong", 0.3, aia=0.62, upper=math.nan)  # fewer than 2 paired seeds
    fair = point("weak", 0.3, aia=0.75, upper=0.0)  # "no worse" includes an upper end of exactly 0
    sel = select_point([unfair, unknown, fair], floor=0.8)
    assert sel.selected == fair
    assert "Fairness Score vs default" in sel.verdicts[unfair.name]
    assert "undefined" in sel.verdicts[unknown.name]


def test_ties_go_to_the_smaller_lambda_then_the_weaker_phi():
    a = point("strong", 0.1, aia=0.70)
    b = point("weak", 0.3, aia=0.70)
    c = point("weak", 0.1, aia=0.70)
    assert select_point([a, b, c], floor=0.8).selected == c
    assert select_point([a, b], floor=0.8).selected == a  # smaller lambda first, whatever the strength
    sel = select_point([point("strong", 0.3, 0.70), point("weak", 0.3, 0.70)], floor=0.8)
    assert sel.selected.strength == "weak" and "tie on AIA among 2 points" in sel.reason


def test_no_feasible_point_selects_none_and_says_why():
    sel = select_point([point("weak", 0.1, 0.8, utility=0.5), point("strong", 0.1, math.nan)], floor=0.8)
    assert sel.selected is None and sel.reason.startswith("none selected")
    assert "no AIA" in sel.verdicts["strong, λ_priv=0.1"]
    assert select_point([], floor=0.8).selected is None


def test_the_registered_grid():
    grid = load_grid()
    assert grid.strengths == {"weak": "paper_minimal", "strong": "strong"}
    assert grid.lambdas == [0.0, 0.03, 0.1, 0.3, 1.0]
    assert grid.tuning_seeds == list(range(100, 105)) and grid.confirmation_seeds == list(range(130, 140))
    assert grid.use_tuned is False  # phi is chosen on the presets; tune starts from it
    assert grid.baselines == ["fedavg", "fedavg_dp"] and grid.default == ("weak", 0.1)
    assert grid.rule["utility"]["classification"]["min_minus"] == 0.005
    assert grid.rule["utility"]["detection"]["min_times"] == 0.98
    assert grid.rule["fairness"]["max_upper"] == 0.02 and grid.rule["minimise"] == "attack/aia_balanced_accuracy"


def test_a_dataset_tunes_on_its_declared_seeds(tmp_path: Path):
    import yaml

    from resfl_lightning.analysis.experiment import ExperimentError
    from resfl_lightning.analysis.frontier import grid_file

    grid = load_grid()
    assert grid.for_dataset("synthetic").tuning_seeds == [100, 101, 102]  # 3 tuning seeds: a detection run is slow
    assert grid.for_dataset("adult").tuning_seeds == list(range(100, 105))
    assert grid.for_dataset("synthetic").confirmation_seeds == grid.confirmation_seeds
    raw = yaml.safe_load(grid_file().read_text())
    for bad in ([], [100, 130]):  # empty, or overlapping the confirmation seeds
        raw["tuning_seeds_by_dataset"] = {"facet": bad}
        path = tmp_path / "frontier.yaml"
        path.write_text(yaml.safe_dump(raw))
        with pytest.raises(ExperimentError, match="tuning_seeds_by_dataset entry"):
            load_grid(path)


def test_each_run_composes_to_its_point(tmp_path: Path):
    from resfl_lightning.analysis.run_settings import composed_settings

    grid = load_grid()
    points = grid_points(grid)
    assert len(points) == 10
    dirs = {p.dir_name(grid, 100) for p in points}
    assert len(dirs) == 9  # lambda_priv = 0 trains no phi: one run serves both strengths
    for p in (Point("strong", 0.3), Point("weak", 0.03), Point(baseline="fedavg_dp")):
        cfg = composed_settings(run_overrides(grid, p, "adult", "iid", 101, tmp_path / "r", ["federation.rounds=2"]))
        alg = cfg["algorithm"]
        assert cfg["seed"] == 101 and cfg["federation"]["rounds"] == 2
        # the rule's val/* metrics exist, and conf/tuned/adult/ (written from this frontier) is not applied
        assert cfg["eval"]["final_validation"] is True and cfg["use_tuned"] is False and cfg["tuned_file"] is None
        assert cfg["attack"]["enabled"] == ["mia", "aia", "update_aia", "eod"]
        if p.baseline:
            assert alg["name"].startswith("fedavg_dp")
            continue
        assert alg["name"] == "resfl" and alg["lambda_priv"] == p.lambda_priv
        strong = p.strength == "strong"
        assert (alg["adversary_steps"], alg["adversary_lr"]) == ((5, 0.01) if strong else (1, 0.001))


TINY_GRID = """
method: resfl
strengths: {weak: paper_minimal, strong: strong}
lambda_priv: [0.3]
tuning_seeds: [100]
confirmation_seeds: [110]
baselines: [fedavg]
attacks: [aia]
default: {strength: weak, lambda_priv: 0.3}
rule:
  minimise: attack/aia_balanced_accuracy
  utility:
    classification: {metric: val/accuracy, min_minus: 1.0}
    detection: {metric: val/map_50, min_times: 0.0}
  fairness: {metric: val/fairness_score, confidence: 0.95, max_upper: 0.0}
"""


def test_the_rule_reads_its_declared_validation_keys_and_reports_test_utility(tmp_path: Path):
    from resfl_lightning.analysis.frontier import FAIRNESS, TEST_UTILITY, UTILITY, run_values
    from resfl_lightning.analysis.run_data import RunData

    grid = load_grid()
    (tmp_path / "config.yaml").write_text("dataset: {task: classification}\n")
    run = RunData(tmp_path, {"val/accuracy": 0.71, "test/accuracy": 0.93, "val/fairness_score": 0.2,
                             "score/fairness": 0.05, "attack/aia_balanced_accuracy": 0.6})
    values = run_values(grid, run)
    assert (values[UTILITY], values[FAIRNESS], values[TEST_UTILITY]) == (0.71, 0.2, 0.93)
    assert values["score/fairness"] == 0.05 and values["task"] == "classification"


def _rule_strings(node) -> list[str]:
    if isinstance(node, dict):
        return [s for v in node.values() for s in _rule_strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _rule_strings(v)]
    return [node] if isinstance(node, str) else []


def test_no_selection_rule_reads_the_test_split():
    """Selection (the frontier's rule, tune's rule) reads validation keys only: no test/* key and no Fairness or
    Privacy Score computed on the test split (score/*)."""
    from resfl_lightning.resources import conf_dir

    rules = {p.name: yaml.safe_load(p.read_text()).get("rule") for p in sorted((conf_dir() / "table").glob("*.yaml"))}
    rules = {name: rule for name, rule in rules.items() if rule}
    assert {"adversary_frontier.yaml", "tune.yaml"} <= set(rules)
    for name, rule in rules.items():
        keys = [s for s in _rule_strings(rule) if "/" in s]
        assert keys, name
        assert not [k for k in keys if k.startswith(("test/", "score/"))], (name, keys)


def test_no_client_count_check_reads_the_test_split():
    """The robustness grids' client-count checks select a subset's n: they read validation keys only."""
    from resfl_lightning.resources import conf_dir

    metrics = {}
    for path in sorted((conf_dir() / "table").glob("robustness*.yaml")):
        for subset, spec in (yaml.safe_load(path.read_text()).get("subsets") or {}).items():
            if "client_check" in spec:
                metrics[(path.name, subset)] = spec["client_check"]["metric"]
    assert {("robustness.yaml", "detection"), ("robustness_v2.yaml", "detection")} <= set(metrics)
    assert all(m.startswith("val/") for m in metrics.values()), metrics


def test_the_figure_zooms_on_the_compared_points_and_marks_a_baseline_that_learned_nothing(tmp_path, monkeypatch):
    """A DP-SGD baseline at mAP@50 0.005 beside points at ~0.73 would squeeze them into a sliver: the x-axis spans
    the grid points and FedAvg, the far baseline sits at the left edge with its utility in the legend, and the
    rule's utility floor is drawn."""
    from resfl_lightning.analysis import frontier
    from resfl_lightning.analysis.frontier_rule import Selection

    grid = load_grid().for_dataset("synthetic")
    seeds = grid.tuning_seeds

    def runs(utility, aia):
        return {s: {"task": "detection", "utility": utility + 0.01 * i, "attack/aia_balanced_accuracy": aia}
                for i, s in enumerate(seeds)}

    values = {p.label: runs(0.73, 0.42) for p in grid_points(grid)}
    values["fedavg"], values["fedavg_dp"] = runs(0.74, 0.49), runs(0.005, 0.48)
    seen = {}
    monkeypatch.setattr(frontier, "save_figure", lambda fig, ax, title, path: seen.update(ax=ax))
    frontier.plot_frontier(grid, values, Selection(None, {}, "none"), tmp_path / "f.png", "t", "detection", 0.735)
    ax = seen["ax"]
    low, high = ax.get_xlim()
    assert 0.6 < low < 0.73 and 0.75 < high < 0.8
    labels = ax.get_legend_handles_labels()[1]
    assert "fedavg_dp (utility 0.015, off scale)" in labels and "fedavg" in labels
    assert "utility floor 0.735" in labels


@pytest.mark.slow
def test_frontier_end_to_end_on_a_tiny_grid(adult_dir: Path, tmp_path: Path):
    from resfl_lightning.cli.frontier import main

    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(TINY_GRID)
    out, results = tmp_path / "frontier", tmp_path / "results"
    args = ["--dataset", "adult", "--grid", str(grid_path), "--out", str(out), "--jobs", "1",
            f"dataset.root={adult_dir}", "federation.rounds=1"]
    assert main([*args, "--results", str(results)]) == 0
    text = (out / "frontier.md").read_text()
    assert text.startswith("# Adversary frontier: adult, scenario iid (2 grid points and 1 baselines x 1 tuning seeds")
    assert OmegaConf.create(text.split("```yaml\n")[1].split("```")[0]) == OmegaConf.create(TINY_GRID)
    for label in ("| weak, λ_priv=0.3 | 1 |", "| strong, λ_priv=0.3 | 1 |", "| fedavg | 1 |"):
        assert label in text
    # one seed: the strong point has no paired interval against the default, which is the only feasible point
    assert "undefined (fewer than 2 paired seeds)" in text
    assert "**Selection:** selected weak, λ_priv=0.3" in text
    assert json.loads((out / "selection.json").read_text())["selected"] == {"strength": "weak", "lambda_priv": 0.3}
    assert (out / "frontier.png").stat().st_size > 10_000
    published = (results / "frontier.md").read_text()
    assert "- command: `resfl frontier --dataset adult" in published and "(frontier.png)" in published
    assert (results / "frontier.png").is_file()
    strong_run = OmegaConf.load(out / "resfl-strong-lp0.3-s100" / "config.yaml")
    assert strong_run.algorithm.adversary_steps == 5 and strong_run.algorithm.lambda_priv == 0.3
    before = (out / "fedavg-s100" / "table_wall_s.json").read_text()
    assert main(args) == 0  # resumable: nothing is trained again
    assert (out / "fedavg-s100" / "table_wall_s.json").read_text() == before

    assert main([*args, "--confirm"]) == 0
    confirmation = (out / "confirmation.md").read_text()
    assert (out / "resfl-weak-lp0.3-s110" / "summary.json").is_file() and (out / "fedavg-s110").is_dir()
    assert not (out / "resfl-strong-lp0.3-s110").exists()  # only the selected point, the default and FedAvg
    assert "| weak, λ_priv=0.3 − fedavg | n/a" in confirmation  # one seed: no interval
    assert "**Verdict: default kept" in confirmation  # the rule selected the default: nothing to confirm
    assert "(selected = RESFL default weak, λ_priv=0.3 vs FedAvg" in confirmation
    assert confirmation.count("| weak, λ_priv=0.3 − fedavg |") == 1  # not once as selected and once as default
    # a point named on the command line runs without this machine's selection.json, and says so
    (out / "selection.json").unlink()
    assert main([*args, "--confirm", "--point", "strong,0.3"]) == 0
    named = (out / "confirmation.md").read_text()
    assert "named on the command line (--point strong,0.3)" in named and "**Verdict: not confirmed**" in named
    assert (out / "resfl-strong-lp0.3-s110" / "summary.json").is_file()


def test_confirm_refuses_without_a_selection(tmp_path: Path):
    from resfl_lightning.cli.frontier import main

    with pytest.raises(SystemExit, match="run the tuning stage"):
        main(["--confirm", "--out", str(tmp_path)])
    (tmp_path / "selection.json").write_text(json.dumps({"selected": None, "reason": "none selected: x",
                                                        "grid": load_grid().text}))
    with pytest.raises(SystemExit, match="nothing to confirm: none selected"):
        main(["--confirm", "--out", str(tmp_path)])


def test_a_confirmation_names_the_tuning_seeds_its_dataset_selected_on(tmp_path: Path):
    """The detection frontier tunes on 100-102 (tuning_seeds_by_dataset): its confirmation said 100-104."""
    from resfl_lightning.analysis.execute import Context
    from resfl_lightning.analysis.frontier import Frontier

    (tmp_path / "selection.json").write_text(json.dumps({"selected": {"strength": "weak", "lambda_priv": 0.1},
                                                        "reason": "selected weak", "grid": load_grid().text}))
    for dataset, seeds in (("synthetic", "[100, 101, 102]"), ("adult", "[100, 101, 102, 103, 104]")):
        ctx = Context(dataset, "group_skew", [], 1, "resfl frontier --confirm", tmp_path, None, {"confirm": True})
        grid, points, run_seeds, selected, provenance = Frontier().stage(ctx, tmp_path)
        assert provenance == f"Selected on the tuning seeds {seeds}: selected weak."
        assert run_seeds == list(range(130, 140)) and selected == Point("weak", 0.1)


def test_confirmation_verdict_needs_all_three_conditions():
    from resfl_lightning.analysis.frontier_rule import confirmation_verdict

    ok, why = confirmation_verdict(0.846, 0.843, -0.31, -0.22, -0.058, 0.02)
    assert ok and "below 0" in why
    assert not confirmation_verdict(0.840, 0.843, -0.31, -0.22, -0.058, 0.02)[0]  # utility under the floor
    assert not confirmation_verdict(0.846, 0.843, -0.31, +0.01, -0.058, 0.02)[0]  # AIA interval holds 0
    assert not confirmation_verdict(0.846, 0.843, -0.31, -0.22, +0.03, 0.02)[0]  # fairness beyond the margin
    assert not confirmation_verdict(float("nan"), 0.843, -0.31, -0.22, -0.058, 0.02)[0]


def test_keeping_the_default_is_judged_on_the_utility_floor_only():
    from resfl_lightning.analysis.frontier_rule import default_kept_verdict

    ok, why = default_kept_verdict(0.52, 0.49)
    assert ok and "no default changes" in why and "0.5200 >= floor 0.4900" in why
    assert not default_kept_verdict(0.47, 0.49)[0]
    assert not default_kept_verdict(float("nan"), 0.49)[0]


def test_a_named_point_must_be_on_the_grid(tmp_path: Path):
    from resfl_lightning.analysis.experiment import ExperimentError
    from resfl_lightning.analysis.frontier import Point, parse_point
    from resfl_lightning.cli.frontier import main

    grid = load_grid()
    assert parse_point("weak,0.1", grid) == Point("weak", 0.1)
    assert parse_point("strong, 1", grid) == Point("strong", 1.0)
    for bad in ("weak,0.2", "medium,0.1", "weak"):
        with pytest.raises(ExperimentError, match="--point"):
            parse_point(bad, grid)
    with pytest.raises(SystemExit, match="use it with --confirm"):
        main(["--point", "weak,0.1", "--out", str(tmp_path)])
