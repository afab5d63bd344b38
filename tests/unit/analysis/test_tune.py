"""`resfl tune`: the selection rule on hand-made values, the merge with a tuned file already there, the written file
as `resfl train` loads it, the trial log, each run's composed settings, and (slow) the command end to end."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.table import algorithm_presets
from resfl_lightning.analysis.tune import (
    MethodTuning,
    References,
    check_user_overrides,
    frozen_bases,
    plan_tuned_file,
    run_overrides,
    tune_markdown,
    tune_method,
    write_tuned_file,
)
from resfl_lightning.analysis.tune_grid import load_settings
from resfl_lightning.analysis.tune_rule import TrialValues, merged_tuned, select_trial, with_learned_floor
from resfl_lightning.resources import conf_dir
from resfl_lightning.run_config.tuned import load_tuned, tuned_path

SEEDS = [120, 121, 122]
# a cheap constrained method whose grid's trial 1 is lr x 1/3; the tests of first-time tuning start it from its preset
# (use_tuned=false, a repository path that does not exist), whatever tuned files the repository ships
UNTUNED = "resfl_af_cluster"


def trial(index: int, utility: list[float | None], fairness: list[float | None] | None = None,
          below: list[str | None] | None = None) -> TrialValues:
    return TrialValues(index, dict(zip(SEEDS, utility)), dict(zip(SEEDS, fairness or [])),
                       dict(zip(SEEDS, below or [])))


def test_the_best_mean_validation_utility_wins():
    sel = select_trial([trial(0, [0.80, 0.81, 0.82]), trial(1, [0.83, 0.80, 0.83]), trial(2, [0.79, 0.79, 0.79])],
                       SEEDS)
    assert sel.selected == 1 and sel.reason.startswith("selected trial 1: mean validation utility 0.8200")
    assert set(sel.verdicts.values()) == {"feasible"}


def test_the_fairness_constraint_excludes_a_trial_with_better_utility():
    preset = trial(0, [0.80, 0.80, 0.80], [0.10, 0.12, 0.11])
    unfair = trial(1, [0.90, 0.90, 0.90], [0.13, 0.15, 0.14])  # +0.03 Fairness Score: beyond the 0.02 margin
    within = trial(2, [0.82, 0.82, 0.82], [0.12, 0.14, 0.13])  # +0.02: on the margin, allowed
    sel = select_trial([preset, unfair, within], SEEDS, max_increase=0.02)
    assert sel.selected == 2
    assert sel.verdicts[1] == "excluded: validation Fairness Score +0.0300 vs trial 0 (> +0.02)"
    assert sel.reference.label == "trial 0" and sel.reference.fairness == {120: 0.10, 121: 0.12, 122: 0.11}
    assert select_trial([preset, unfair, within], SEEDS).selected == 1  # a method without the constraint


def test_ties_go_to_the_trial_listed_first_and_trial_0_wins_ties():
    sel = select_trial([trial(0, [0.8] * 3), trial(1, [0.9] * 3), trial(2, [0.9] * 3)], SEEDS)
    assert sel.selected == 1 and "tied with 1 other trials: the first listed" in sel.reason
    assert select_trial([trial(0, [0.9] * 3), trial(1, [0.9] * 3)], SEEDS).selected == 0


def test_missing_values_exclude_a_trial_and_an_incomplete_preset_only_itself():
    sel = select_trial([trial(0, [0.8] * 3, [0.1] * 3), trial(1, [0.9, None, 0.9], [0.1] * 3),
                        trial(2, [0.9, 0.9, math.nan], [0.1] * 3), trial(3, [0.95] * 3, [0.1, None, 0.1])],
                       SEEDS, max_increase=0.02)
    assert sel.selected == 0
    assert sel.verdicts[1] == "excluded: no validation utility on seeds [121]"
    assert sel.verdicts[2] == "excluded: no validation utility on seeds [122]"
    assert sel.verdicts[3] == "excluded: no validation Fairness Score on seeds [121]"
    # rule version 1 selected nothing here; version 2 excludes the incomplete preset and keeps the complete trial
    sel = select_trial([trial(0, [0.8, None, 0.8]), trial(1, [0.9] * 3)], SEEDS)
    assert sel.selected == 1 and sel.verdicts[0] == "excluded: no validation utility on seeds [121]"
    none = select_trial([trial(0, [0.8, None, 0.8]), trial(1, [0.9, 0.9, None])], SEEDS)
    assert none.selected is None and none.reason.startswith("none selected: no trial has a value and learned")
    with pytest.raises(ValueError, match="start with trial 0"):
        select_trial([trial(1, [0.9] * 3)], SEEDS)


DEAD = "val accuracy 0.760 <= majority-class rate 0.760"


def test_a_trial_must_learn_on_every_tuning_seed():
    sel = select_trial([trial(0, [0.80] * 3), trial(1, [0.90, 0.90, 0.76], below=[None, None, DEAD]),
                        trial(2, [0.81] * 3)], SEEDS)
    assert sel.selected == 2 and sel.verdicts[1] == f"excluded: did not learn on seeds [122] ({DEAD})"
    none = select_trial([trial(0, [0.76] * 3, below=[DEAD] * 3)], SEEDS)
    assert none.selected is None and none.verdicts[0].startswith("excluded: did not learn on seeds [120, 121, 122]")


def test_the_fairness_reference_is_the_preset_where_it_learned():
    # PUFFLE's case in rule version 1: the preset has no Fairness Score on seed 120 (and did not learn on 121)
    preset = trial(0, [0.80, 0.76, 0.80], [None, 0.0, 0.20], below=[None, DEAD, None])
    worse = trial(1, [0.82] * 3, [0.50, 0.50, 0.23])  # +0.03 on seed 122, the only reference seed
    within = trial(2, [0.81] * 3, [0.50, 0.50, 0.22])  # +0.02: allowed
    sel = select_trial([preset, worse, within], SEEDS, max_increase=0.02)
    assert sel.reference.label == "trial 0" and sel.reference.fairness == {122: 0.20}
    assert sel.verdicts[1] == "excluded: validation Fairness Score +0.0300 vs trial 0 (> +0.02)"
    assert sel.selected == 2 and sel.verdicts[0].startswith("excluded: did not learn on seeds [121]")


def test_a_preset_that_never_learned_is_replaced_by_fedavgs_as_the_fairness_reference():
    # CurvFed's case in rule version 1: a constant predictor (Fairness Score 0.0) made every learning trial "unfair"
    constant = trial(0, [0.76] * 3, [0.0] * 3, below=[DEAD] * 3)
    learns = trial(1, [0.82] * 3, [0.41] * 3)
    fedavg = dataclasses.replace(trial(0, [0.83] * 3, [0.40] * 3), method="fedavg")
    sel = select_trial([constant, learns], SEEDS, max_increase=0.02, fallback=fedavg)
    assert sel.selected == 1 and sel.reference.label == "fedavg's preset"
    assert sel.reference.fairness == {120: 0.40, 121: 0.40, 122: 0.40}
    assert select_trial([constant, trial(1, [0.82] * 3, [0.43] * 3)], SEEDS, 0.02, fedavg).verdicts[1] == (
        "excluded: validation Fairness Score +0.0300 vs fedavg's preset (> +0.02)")
    alone = select_trial([constant, learns], SEEDS, max_increase=0.02)  # no fallback runs
    assert alone.selected is None and alone.reference is None
    assert alone.verdicts[1].startswith("excluded: no Fairness Score reference")
    assert select_trial([constant, learns], SEEDS).selected == 1  # unconstrained: no reference needed


MAJORITY = [0.749, 0.751, 0.750]  # the constant prediction's validation accuracy per seed
FEDAVG = dataclasses.replace(trial(0, [0.849, 0.851, 0.850], [0.40] * 3), method="fedavg",
                             trivial=dict(zip(SEEDS, MAJORITY)))  # gains 0.100 on every seed: floors 0.799/0.801/0.800


def floor_trial(index: int, utility: list[float], fairness: list[float] | None = None) -> TrialValues:
    return dataclasses.replace(trial(index, utility, fairness), trivial=dict(zip(SEEDS, MAJORITY)))


def reasons(t: TrialValues) -> dict[int, str | None]:
    return {s: t.below_floor.get(s) for s in SEEDS}


def test_the_learned_floor_is_a_share_of_fedavgs_gain_over_a_constant_prediction_on_the_same_seed():
    # hand-computed: seed 120 floor 0.749 + 0.5 x 0.100 = 0.799; 0.798 misses it, 0.799 and 0.80 reach it
    assert reasons(with_learned_floor(floor_trial(1, [0.798, 0.801, 0.80]), FEDAVG, 0.5)) == {
        120: "val utility 0.798 < 0.799: gained 0.049 over a constant prediction, less than 0.5 x fedavg's preset's "
             "0.100", 121: None, 122: None}
    assert reasons(with_learned_floor(floor_trial(1, [0.799, 0.801, 0.80]), FEDAVG, 0.5)) == dict.fromkeys(SEEDS)
    # a seed where FedAvg's preset gained nothing (or has no run) keeps the table's floor alone
    flat = dataclasses.replace(FEDAVG, utility={120: 0.749, 121: None, 122: 0.850})
    low = reasons(with_learned_floor(floor_trial(1, [0.76] * 3), flat, 0.5))
    assert low[120] is None and low[121] is None and low[122].startswith("val utility 0.760 < 0.800")
    # the table's own reason is kept where it already applies
    dead = dataclasses.replace(floor_trial(1, [0.749] * 3), below_floor=dict.fromkeys(SEEDS, DEAD))
    assert reasons(with_learned_floor(dead, FEDAVG, 0.5)) == dict.fromkeys(SEEDS, DEAD)
    # detection: the constant prediction's mAP@50 is 0, so the floor is 0.5 x FedAvg's mAP@50 (detection learning bar)
    det_fedavg = dataclasses.replace(trial(0, [0.30, 0.20, 0.40]), method="fedavg", trivial=dict.fromkeys(SEEDS, 0.0))
    det = dataclasses.replace(trial(1, [0.15, 0.099, 0.30]), trivial=dict.fromkeys(SEEDS, 0.0))
    assert [s for s, why in reasons(with_learned_floor(det, det_fedavg, 0.5)).items() if why] == [121]


def test_rule_3_rejects_a_nearly_constant_preset_and_compares_fairness_with_fedavg_instead():
    # rule version 2's failure on Adult (docs/results/tune-adult-iid-rule2.md): PUFFLE's preset cleared the majority
    # rate by a hair (0.750 vs 0.749) with a low Fairness Score, and every trial that learned was "less fair"
    near_constant = floor_trial(0, [0.750, 0.752, 0.751], [0.02] * 3)
    learns = floor_trial(1, [0.806, 0.809, 0.807], [0.41] * 3)
    v2 = select_trial([near_constant, learns], SEEDS, max_increase=0.02, fallback=FEDAVG)
    assert v2.selected == 0 and v2.reference.label == "trial 0"
    v3 = select_trial([with_learned_floor(t, FEDAVG, 0.5) for t in (near_constant, learns)], SEEDS,
                      max_increase=0.02, fallback=with_learned_floor(FEDAVG, FEDAVG, 0.5))
    assert v3.selected == 1 and v3.reference.label == "fedavg's preset"
    assert v3.verdicts[0].startswith("excluded: did not learn on seeds [120, 121, 122] (val utility 0.750 < 0.799")
    unfair = floor_trial(2, [0.83] * 3, [0.43] * 3)  # learns, but +0.03 less fair than FedAvg's preset
    v3 = select_trial([with_learned_floor(t, FEDAVG, 0.5) for t in (near_constant, learns, unfair)], SEEDS, 0.02,
                      with_learned_floor(FEDAVG, FEDAVG, 0.5))
    assert v3.selected == 1 and v3.verdicts[2].startswith("excluded: validation Fairness Score +0.0300 vs fedavg's")


def test_tune_method_applies_the_shipped_rules_floor_from_the_runs_values(tmp_path: Path):
    settings = load_settings()
    assert settings.version >= 3 and settings.learned_reference == "fedavg" and settings.learned_fraction == 0.5
    runs = {0: [0.750, 0.752, 0.751], 1: [0.806, 0.809, 0.807]}
    for t, accs in runs.items():
        for s, acc in zip(SEEDS, accs):
            rd = tmp_path / f"puffle-t{t}-s{s}"
            rd.mkdir()
            (rd / "summary.json").write_text(json.dumps(
                {"val/accuracy": acc, "val/majority_class_rate": MAJORITY[SEEDS.index(s)],
                 "val/fairness_score": 0.02 if t == 0 else 0.41}))
            (rd / "config.yaml").write_text("dataset:\n  task: classification\n")
    unfloored = tune_method("puffle", [(), ("x=1",)], [[], ["x=1"]], {"file": None, "overrides": []}, tmp_path,
                            SEEDS, settings)
    refs = References(FEDAVG, with_learned_floor(FEDAVG, FEDAVG, 0.5))
    floored = tune_method("puffle", [(), ("x=1",)], [[], ["x=1"]], {"file": None, "overrides": []}, tmp_path,
                          SEEDS, settings, refs)
    assert floored.values[0][120]["trivial"] == 0.749
    assert unfloored.selection.selected == 0  # without the references: rule version 2's outcome
    assert floored.selection.selected == 1 and floored.selection.reference.label == "fedavg's preset"
    text = tune_markdown("# t", settings, [floored], SEEDS, "classification", [], FEDAVG)
    assert ("Learned floor (a trial must reach it on every tuning seed): a constant prediction's validation utility "
            "plus 0.5 x the gain of fedavg's preset over it; seed 120: 0.7990, seed 121: 0.8010, seed 122: "
            "0.8000.") in text


def test_the_reference_presets_run_beside_whatever_is_tuned():
    settings = load_settings()
    assert settings.reference_methods(["fedsam"]) == ["fedavg"]  # the learned floor needs FedAvg's preset
    assert settings.reference_methods(["puffle"]) == ["fedavg"]  # and so does the fairness fallback: once
    v2 = dataclasses.replace(settings, learned_reference=None, learned_fraction=None)
    assert v2.reference_methods(["fedsam"]) == [] and v2.reference_methods(["puffle"]) == ["fedavg"]


def test_the_learned_fraction_must_be_a_share(tmp_path: Path):
    from resfl_lightning.analysis.tune_grid import settings_file

    raw = yaml.safe_load(settings_file().read_text())
    for bad_fraction in (0, 1.5):
        raw["rule"]["learned"]["fraction"] = bad_fraction
        bad = tmp_path / "tune.yaml"
        bad.write_text(yaml.safe_dump(raw))
        with pytest.raises(ExperimentError, match=r"rule.learned.fraction must lie in \(0, 1\]"):
            load_settings(bad)
    raw["rule"]["learned"]["reference"] = "nonesuch"
    raw["rule"]["learned"]["fraction"] = 0.5
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ExperimentError, match="learned.reference: no conf/algorithm/ preset"):
        load_settings(bad)


ADULT_RESFL = {"selected_by": "resfl frontier --dataset adult", "evidence": ["docs/results/frontier-adult-iid-sex.md"],
               "overrides": ["adversary=strong", "algorithm.lambda_priv=0.3"]}


def test_the_merge_keeps_what_the_trial_does_not_set_and_extends_the_provenance():
    merged = merged_tuned(ADULT_RESFL, ["algorithm.lambda_fair=0.03", "algorithm.lambda_priv=1.0"], "resfl tune x",
                          "docs/results/tune-adult-iid.md")
    assert merged["overrides"] == ["adversary=strong", "algorithm.lambda_fair=0.03", "algorithm.lambda_priv=1.0"]
    assert merged["selected_by"] == "resfl frontier --dataset adult; then resfl tune x"
    assert merged["evidence"] == ["docs/results/frontier-adult-iid-sex.md", "docs/results/tune-adult-iid.md"]
    assert merged_tuned(merged, ["algorithm.lambda_fair=0.03", "algorithm.lambda_priv=1.0"], "resfl tune x",
                        "docs/results/tune-adult-iid.md") == merged  # the same command again changes nothing
    kept = merged_tuned(ADULT_RESFL, [], "resfl tune x", "e.md")  # the preset won: the file stays, provenance grows
    assert kept["overrides"] == ADULT_RESFL["overrides"] and kept["evidence"][-1] == "e.md"
    assert merged_tuned(None, [], "resfl tune x", "e.md") is None
    assert merged_tuned(None, ["optim.lr=0.003"], "resfl tune x", "e.md") == {
        "selected_by": "resfl tune x", "evidence": ["e.md"], "overrides": ["optim.lr=0.003"]}


def tuning(method: str = "resfl", selected_values: float = 0.85, base: dict | None = None) -> MethodTuning:
    grid = [(), ("optim.lr*=1/3",), ("algorithm.lambda_fair=0.03",)]
    trials = [[], ["optim.lr=0.00333333"], ["algorithm.lambda_fair=0.03"]]
    utility = {0: 0.84, 1: 0.83, 2: selected_values}
    values = {t: {s: {"task": "classification", "utility": u + 0.001 * (s - 121), "fairness": 0.10 + 0.005 * t,
                      "epsilon": None} for s in SEEDS} for t, u in utility.items()}
    values[1][122] = None  # a run that did not finish
    tvs = [TrialValues(t, {s: (v or {}).get("utility") for s, v in runs.items()},
                       {s: (v or {}).get("fairness") for s, v in runs.items()}) for t, runs in values.items()]
    for runs in values.values():
        for v in runs.values():
            if v is not None:
                v["below_floor"] = None
    return MethodTuning(method, grid, trials, base or {"file": None, "overrides": []}, values,
                        select_trial(tvs, SEEDS, 0.02), 0.02)


def test_the_written_file_merges_keeps_its_comments_and_loads_as_resfl_train_loads_it(tmp_path: Path):
    target = tmp_path / "tuned" / "adult" / "resfl.yaml"
    target.parent.mkdir(parents=True)
    target.write_text("# why the frontier chose phi\n" + yaml.safe_dump(ADULT_RESFL, sort_keys=False))
    t = tuning(base={"file": "conf/tuned/adult/resfl.yaml", "overrides": ADULT_RESFL["overrides"]})  # started from it
    t.values[1][122] = {"task": "classification", "utility": 0.5, "fairness": 0.1, "below_floor": None,
                        "epsilon": None}  # complete
    assert t.selection.selected == 2
    text = plan_tuned_file(t, target, tuned_path("adult", t.method), "resfl tune --dataset adult",
                           "docs/results/tune-adult-iid.md", SEEDS)
    assert t.outcome.startswith(f"Tuned file merged into {target}: overrides adversary=strong, ")
    write_tuned_file(target, text)
    loaded = load_tuned(target)
    assert loaded.overrides == ("adversary=strong", "algorithm.lambda_priv=0.3", "algorithm.lambda_fair=0.03")
    lines = target.read_text().splitlines()
    assert lines[0] == "# why the frontier chose phi" and lines[1].startswith("# `resfl tune` (conf/table/tune.yaml")
    assert "trial 2 (algorithm.lambda_fair=0.03)" in lines[1]
    assert yaml.safe_load(target.read_text())["evidence"][-1] == "docs/results/tune-adult-iid.md"
    assert "grid conf/tune/resfl.yaml" in lines[1]


def test_the_written_file_holds_what_the_selected_trial_trained_with_when_the_trials_ignored_the_file(tmp_path: Path):
    """use_tuned=false: the trials start from the preset (base: none), so the existing file's keys are not kept (they
    were, making a file of a combination no run trained), and the preset winning leaves a file with no override."""
    target = tmp_path / "resfl.yaml"
    target.write_text(yaml.safe_dump(ADULT_RESFL, sort_keys=False))
    t = tuning()  # base: none
    t.values[1][122] = {"task": "classification", "utility": 0.5, "fairness": 0.1, "below_floor": None,
                        "epsilon": None}
    assert t.selection.selected == 2
    text = plan_tuned_file(t, target, tmp_path / "none.yaml", "resfl tune x use_tuned=false", "e.md", SEEDS)
    assert yaml.safe_load(text)["overrides"] == ["algorithm.lambda_fair=0.03"]
    preset = tuning(selected_values=0.80)
    preset.values[1][122] = t.values[1][122]
    preset.selection = select_trial([preset.trial_values(i) for i in range(3)], SEEDS)
    assert preset.selection.selected == 0
    assert plan_tuned_file(preset, target, tmp_path / "none.yaml", "resfl tune x", "e.md", SEEDS) is None
    assert "did not start from" in preset.outcome and "not what they selected" in preset.outcome
    assert merged_tuned(ADULT_RESFL, [], "x", "e.md", base=["optim.lr=0.03"])["overrides"] == ["optim.lr=0.03"]


def test_the_written_file_names_a_scopes_own_grid(tmp_path: Path):
    # It named conf/tune/<method>.yaml whatever grid the trials came from (PUFFLE's Adult grid, conf/tune/adult/).
    t = tuning()
    t.grid_file = "tune/adult/resfl.yaml"
    t.values[1][122] = {"task": "classification", "utility": 0.5, "fairness": 0.1, "below_floor": None,
                        "epsilon": None}
    text = plan_tuned_file(t, tmp_path / "resfl.yaml", tmp_path / "none.yaml", "c", "e.md", SEEDS)
    assert "(conf/table/tune.yaml, grid conf/tune/adult/resfl.yaml, seeds" in text.splitlines()[0]


def test_no_file_when_the_preset_wins_without_one_or_runs_are_missing(tmp_path: Path):
    target = tmp_path / "adult" / f"{UNTUNED}.yaml"
    preset = tuning(UNTUNED, selected_values=0.80)
    preset.values[1][122] = {"task": "classification", "utility": 0.5, "fairness": 0.1, "below_floor": None,
                             "epsilon": None}
    preset.selection = select_trial([preset.trial_values(t) for t in range(3)], SEEDS)
    assert preset.selection.selected == 0
    shipped = tmp_path / "repository" / f"{UNTUNED}.yaml"  # none shipped
    assert plan_tuned_file(preset, target, shipped, "c", "e.md", SEEDS) is None
    assert preset.outcome == "Trial 0 (the preset) selected and no tuned file existed: none written."
    missing = tuning(UNTUNED)
    assert plan_tuned_file(missing, target, shipped, "c", "e.md", SEEDS) is None
    assert "runs missing" in missing.outcome and not target.exists()


def test_the_trial_log_lists_every_trial_with_its_seeds_mean_constraint_and_verdict():
    t = tuning(base={"file": "conf/tuned/adult/resfl.yaml", "overrides": ["adversary=strong"]})
    t.outcome = "Tuned file written to x."
    text = tune_markdown("# Tuning budget: adult", load_settings(), [t], SEEDS, "classification", ["run y failed"])
    assert text.startswith("# Tuning budget: adult\n") and "```yaml\n# The equal tuning budget" in text
    assert "Base (applied to every trial): conf/tuned/adult/resfl.yaml (`adversary=strong`)." in text
    assert ("| trial | overrides | seed 120 | seed 121 | seed 122 | mean val accuracy | "
            "val Fairness Score (Δ vs reference) | verdict |") in text
    assert "| 0 | (the preset) | 0.8390 | 0.8400 | 0.8410 | 0.8400 | 0.1000 (+0.0000) | feasible |" in text
    assert ("| 1 | `optim.lr=0.00333333` (optim.lr*=1/3) | 0.8290 | 0.8300 | n/a | n/a | n/a | "
            "excluded: no validation utility on seeds [122] |") in text
    assert ("| 2 | `algorithm.lambda_fair=0.03` | 0.8490 | 0.8500 | 0.8510 | 0.8500 | 0.1100 (+0.0100) | "
            "**selected** |") in text
    assert "Fairness reference: trial 0 on seeds [120, 121, 122] (mean 0.1000)." in text
    assert "**Selection:** selected trial 2: mean validation utility 0.8500. Tuned file written to x." in text
    assert text.rstrip().endswith("- run y failed")


def test_a_run_composes_to_its_base_trial_and_user_overrides(tmp_path: Path):
    from resfl_lightning.analysis.run_settings import composed_settings

    base = ["adversary=strong", "algorithm.lambda_priv=0.3"]
    cfg = composed_settings(run_overrides("adult", "iid", "resfl", 121, tmp_path / "r", base,
                                          ["algorithm.lambda_priv=1.0", "algorithm.lambda_fair=0.03"],
                                          ["federation.rounds=2"]))
    alg = cfg["algorithm"]
    assert (alg["name"], alg["lambda_priv"], alg["lambda_fair"], alg["adversary_steps"]) == ("resfl", 1.0, 0.03, 5)
    assert cfg["seed"] == 121 and cfg["federation"]["rounds"] == 2 and cfg["attack"]["enabled"] is None
    assert (cfg["use_tuned"], cfg["tuned_file"]) == (False, None)  # the frozen base stands in for the file


V1 = ["experiment=table_synthetic_v1"]  # the first detection preset, tuned in conf/tuned/synthetic/


def test_bases_are_frozen_when_a_method_is_first_tuned(tmp_path: Path):
    # the first detection preset's tune (conf/tuned/synthetic/) as the base; a method without a file there has none
    untuned = next(m for m in ("curvfed", *algorithm_presets())
                   if not (conf_dir() / f"tuned/synthetic/{m}.yaml").exists())
    bases = frozen_bases(tmp_path, "synthetic", ["resfl", untuned], V1)
    assert bases["resfl"] == {"file": "conf/tuned/synthetic/resfl.yaml",
                              "overrides": list(load_tuned(conf_dir() / "tuned/synthetic/resfl.yaml").overrides)}
    assert bases[untuned] == {"file": None, "overrides": []}
    assert frozen_bases(tmp_path, "synthetic", ["resfl"], [*V1, "optim.lr=0.5"])["resfl"] == bases["resfl"]
    other = tmp_path / "other"
    other.mkdir()
    assert frozen_bases(other, "synthetic", ["resfl"], [*V1, "use_tuned=false"])["resfl"]["overrides"] == []
    # the calibrated preset (the table preset, chosen when the user names none) has its own folder, never the first's
    calibrated = tmp_path / "calibrated"
    calibrated.mkdir()
    own = load_tuned(conf_dir() / "tuned/table_synthetic/resfl.yaml")
    assert frozen_bases(calibrated, "synthetic", ["resfl"], [])["resfl"] == {
        "file": "conf/tuned/table_synthetic/resfl.yaml", "overrides": list(own.overrides)}
    assert frozen_bases(other, "synthetic", ["resfl"], [])["resfl"]["overrides"] == []  # as first recorded there


def test_the_ledger_carries_the_bases_its_runs_started_from(tmp_path: Path):
    from resfl_lightning.analysis import run_ledger

    for machine in "abc":
        (tmp_path / machine / "tune_x").mkdir(parents=True)
    run_ledger.use(tmp_path / "ledger")
    try:
        first = frozen_bases(tmp_path / "a" / "tune_x", "synthetic", ["resfl"], V1)
        carried = tmp_path / "ledger" / "tune_x" / "bases.json"
        assert json.loads(carried.read_text()) == first
        # another machine: the tuned file has changed since (here: the ledger's copy says resfl started untuned)
        carried.write_text(json.dumps({"resfl": {"file": None, "overrides": []}}))
        assert frozen_bases(tmp_path / "b" / "tune_x", "synthetic", ["resfl"], V1)["resfl"]["overrides"] == []
        assert json.loads((tmp_path / "b" / "tune_x" / "bases.json").read_text())["resfl"]["file"] is None
    finally:
        run_ledger.use(None)
    # no ledger: the bases come from conf/tuned/ as it is now
    assert frozen_bases(tmp_path / "c" / "tune_x", "synthetic", ["resfl"], V1)["resfl"] == first["resfl"] != {
        "file": None, "overrides": []}


def test_user_overrides_may_not_fix_what_a_run_or_a_grid_sets():
    grids = {"fedsam": [(), ("optim.lr*=3",), ("algorithm.sam_rho=0.1",)]}
    check_user_overrides(["federation.rounds=1", "use_tuned=false"], grids)
    with pytest.raises(ExperimentError, match=r"\['seed'\] are set by every tuning run"):
        check_user_overrides(["seed=3"], grids)
    with pytest.raises(ExperimentError, match=r"\['algorithm.sam_rho'\] are tuned by fedsam's grid"):
        check_user_overrides(["algorithm.sam_rho=0.2"], grids)
    with pytest.raises(ExperimentError, match=r"\['optim.lr'\] are tuned"):
        check_user_overrides(["optim.lr=0.1"], grids)


def test_tuning_seeds_that_a_table_or_the_frontier_uses_are_refused(tmp_path: Path):
    from resfl_lightning.analysis.execute import Context, execute
    from resfl_lightning.analysis.tune import Tune

    def run_tune(methods, **options):
        return execute(Tune(), Context("adult", "iid", [], 1, "resfl tune", tmp_path, None,
                                       {"methods": methods, **options}))

    for seeds in ([3], [104, 120], [120, 120]):
        with pytest.raises(ExperimentError, match="tuning seeds"):
            run_tune(["fedavg"], seeds=seeds)
    with pytest.raises(ExperimentError, match="--trials must lie in 1..8"):
        run_tune(["fedavg"], trials=9)
    with pytest.raises(ExperimentError, match="--methods: unknown"):
        run_tune(["nope"])


@pytest.mark.slow
def test_tune_end_to_end_on_the_first_two_trials(adult_dir: Path, tmp_path: Path):
    from resfl_lightning.cli.tune import main

    # use_tuned=false: the trials start from the preset, not from the tuned file the repository ships
    out, results, tuned = tmp_path / "runs", tmp_path / "results" / "tune-adult-iid.md", tmp_path / "tuned"
    shipped = conf_dir() / "tuned" / "adult" / f"{UNTUNED}.yaml"
    before_shipped = shipped.read_text() if shipped.is_file() else None
    args = ["--dataset", "adult", "--methods", UNTUNED, "--trials", "2", "--seeds", "120", "--jobs", "1",
            "--out", str(out), "--results", str(results), "--tuned-dir", str(tuned), f"dataset.root={adult_dir}",
            "federation.rounds=1", "use_tuned=false"]
    assert main(args) == 0
    for t in (0, 1):
        run = out / f"{UNTUNED}-t{t}-s120"
        summary = json.loads((run / "summary.json").read_text())
        assert 0 < summary["val/accuracy"] < 1 and "val/fairness_score" in summary
        assert OmegaConf.load(run / "config.yaml").optim.lr == pytest.approx(0.01 / 3 if t else 0.01, rel=1e-5)
    text = results.read_text()
    assert text.startswith("# Tuning budget: adult, scenario iid (1 methods x the first 2 of 8 trials x 1 tuning "
                           "seeds [120], plus fedavg's preset as the rule's reference; 3 runs; "
                           "selection rule version 3;")
    assert (out / "fedavg-t0-s120" / "summary.json").is_file()  # the fallback reference ran beside the method
    assert f"- command: `resfl tune --dataset adult --methods {UNTUNED} --trials 2" in text
    assert "| 0 | (the preset) |" in text and "| 1 | `optim.lr=0.00333333` (optim.lr*=1/3) |" in text
    selection = json.loads((out / "selection.json").read_text())[UNTUNED]
    path = tuned / "adult" / f"{UNTUNED}.yaml"
    if selection["selected"] == 1:
        assert load_tuned(path).overrides == ("optim.lr=0.00333333",)
        earlier = yaml.safe_load(before_shipped)["evidence"] if before_shipped else []  # provenance extended
        assert yaml.safe_load(path.read_text())["evidence"] == [*earlier, str(results)]
    else:  # the preset won, or no trial learned in one round: no file
        assert not path.exists() and ("none written" in text or "not written (nothing selected)" in text)
    before = (out / f"{UNTUNED}-t0-s120" / "table_wall_s.json").read_text()
    assert main(args) == 0  # resumable: nothing is trained again, and the same file is written
    assert (out / f"{UNTUNED}-t0-s120" / "table_wall_s.json").read_text() == before
    assert (shipped.read_text() if shipped.is_file() else None) == before_shipped  # --tuned-dir: repository clean


def test_a_dataset_can_declare_its_own_tuning_seeds(tmp_path: Path):
    from resfl_lightning.analysis.tune_grid import reserved_seeds, settings_file

    shipped = load_settings()
    assert shipped.seeds_for("adult") == shipped.seeds == (126, 127, 128)
    assert shipped.seeds_for("synthetic") == (123,) and not set(shipped.seeds_for("synthetic")) & reserved_seeds()
    raw = yaml.safe_load(settings_file().read_text())
    raw["tuning_seeds_by_dataset"] = {"facet": []}
    bad = tmp_path / "tune.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ExperimentError, match="tuning_seeds_by_dataset entry"):
        load_settings(bad)
    t = tuning("fedavg")
    one = tune_markdown("# t", shipped, [t], [123], "detection", [])
    assert 'One tuning seed (123): "learned on every tuning seed" is a single-seed check' in one
    assert "One tuning seed" not in tune_markdown("# t", shipped, [t], SEEDS, "detection", [])


def test_the_default_trial_log_names_the_preset_so_two_presets_never_share_one():
    from resfl_lightning.analysis.execute import Context
    from resfl_lightning.analysis.tune import results_path

    calibrated = results_path(Context("synthetic", "group_skew", []))
    first = results_path(Context("synthetic", "group_skew", ["experiment=table_synthetic_v1"]))
    assert calibrated == Path("docs/results/tune-synthetic-group_skew-table_synthetic.md")
    assert first == Path("docs/results/tune-synthetic-group_skew-table_synthetic_v1.md")
    assert results_path(Context("adult", "iid", ["dataset.sensitive=race"])) == Path(
        "docs/results/tune-adult-iid-race.md")  # no table preset: as before
