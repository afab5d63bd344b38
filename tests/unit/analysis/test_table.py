"""`resfl table`: intervals over seeds (Student-t, pairing by seed) and the runner end to end on Adult. The
statistics of the table (common seeds, floor, corrections, verdicts) are in test_table_statistics.py."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from resfl_lightning.metrics.intervals import paired_difference, t_interval


def test_interval_mean_std_and_student_t_bounds():
    x = [0.81, 0.84, 0.79, 0.86, 0.83]
    iv = t_interval(x)
    half = 2.7764451051977987 * np.std(x, ddof=1) / math.sqrt(5)  # t_{0.975, 4}, from tables
    assert iv.mean == pytest.approx(np.mean(x)) and iv.std == pytest.approx(np.std(x, ddof=1))
    assert (iv.low, iv.high) == pytest.approx((np.mean(x) - half, np.mean(x) + half))
    assert iv.n == 5 and iv.excludes_zero  # all values far above 0


def test_constant_and_single_values():
    iv = t_interval([0.5, 0.5, 0.5])
    assert (iv.low, iv.high, iv.std) == pytest.approx((0.5, 0.5, 0.0))
    one = t_interval([0.7])
    assert one.mean == 0.7 and math.isnan(one.low) and not one.excludes_zero and one.fmt() == "0.700"
    assert t_interval([None, float("nan")]).n == 0 and t_interval([]).fmt() == "n/a"


def test_pairing_by_seed_detects_a_consistent_small_gain_that_unpaired_means_hide():
    base = {0: 0.60, 1: 0.75, 2: 0.90, 3: 0.70, 4: 0.82}
    method = {s: v + 0.01 + 0.002 * (s % 2) for s, v in base.items()}
    paired = paired_difference(method, base)
    assert paired.excludes_zero and paired.low > 0
    # the same numbers unpaired: the seed-to-seed spread swamps the 0.01 gain
    assert t_interval(list(method.values())).low - t_interval(list(base.values())).high < 0
    assert paired_difference({0: 1.0, 9: 2.0}, {0: 0.5}).n == 1  # only seeds both have


def test_paired_difference_is_the_student_t_interval():
    d = [0.299, -0.113, -0.117]
    half = 4.302652729911275 * np.std(d, ddof=1) / math.sqrt(3)  # t_{0.975, 2}, from tables
    iv = paired_difference({s: 1.0 + x for s, x in enumerate(d)}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert iv.low == pytest.approx(np.mean(d) - half) and iv.high == pytest.approx(np.mean(d) + half)
    assert iv.n == 3 and not iv.excludes_zero


def test_three_same_sign_differences_are_not_a_difference_by_themselves():
    # FairFed's Fairness Score on the group-skew table: [min, max] of 3 values (what the percentile bootstrap gave)
    # excluded 0; the t-interval with 2 degrees of freedom does not.
    d = [-0.003, -0.007, -0.066]
    diff = paired_difference(dict(enumerate(d)), {0: 0.0, 1: 0.0, 2: 0.0})
    assert max(d) < 0 and diff.low < 0 < diff.high and not diff.excludes_zero
    # the same differences over 5 seeds of a tight, consistent shift do exclude 0
    assert t_interval([-0.010, -0.012, -0.011, -0.009, -0.013]).high < 0


def test_constant_and_missing_differences():
    same = paired_difference({0: 0.4, 1: 0.5, 2: 0.6}, {0: 0.5, 1: 0.6, 2: 0.7})
    assert (same.low, same.high, same.std) == pytest.approx((-0.1, -0.1, 0.0)) and same.excludes_zero
    zero = paired_difference({0: 0.5, 1: 0.6}, {0: 0.5, 1: 0.6})
    assert (zero.low, zero.high) == (0.0, 0.0) and not zero.excludes_zero
    assert not paired_difference({0: 1.0}, {0: 0.5}).excludes_zero


@pytest.mark.slow
def test_table_runs_methods_over_seeds_and_writes_outputs(adult_dir: Path, tmp_path: Path):
    from resfl_lightning.cli.table import main

    out = tmp_path / "table"
    args = ["--dataset", "adult", "--methods", "resfl", "--seeds", "2", "--out", str(out),
            f"dataset.root={adult_dir}", "federation.rounds=2"]
    results = tmp_path / "docs" / "results" / "adult_iid.md"
    assert main([*args[:-2], "--results", str(results), *args[-2:]]) == 0
    text = results.read_text()
    assert text.startswith("# adult, scenario iid: 2 methods x 2 seeds") and "- command: `resfl table --dataset" in text
    assert text.endswith((out / "table.md").read_text().split("\n", 1)[1].lstrip("\n"))
    rows = list(csv.DictReader((out / "table.csv").open()))
    by = {(r["method"], r["metric"]): r for r in rows}
    assert {r["method"] for r in rows} == {"fedavg", "resfl"}
    assert by[("fedavg", "utility")]["n_seeds"] == "2"
    assert 0.5 < float(by[("resfl", "utility")]["mean"]) <= 1.0
    assert by[("resfl", "privacy_score")]["mean"] not in ("", "nan")
    assert by[("fedavg", "utility")]["diff_vs_fedavg"] == ""  # no difference of the baseline to itself
    assert (out / "pareto.png").stat().st_size > 10_000 and "| resfl |" in (out / "table.md").read_text()
    mechanism = (out / "table.md").read_text().split("What UFM weighting had to act on")[1]
    assert mechanism.count("| resfl |") == 1 and mechanism.count("| fedavg |") == 1  # one mechanism row a method
    assert "DP-SGD accounting" not in mechanism  # neither method runs DP-SGD (the section: test_dp_accounting.py)
    before = (out / "resfl-s1" / "table_wall_s.json").read_text()
    assert main(args) == 0  # resumable: finished runs are not trained again (their saved configs match)
    assert (out / "resfl-s1" / "table_wall_s.json").read_text() == before
    # other settings for the same folder: refused, naming the runs and the setting, nothing retrained or mixed in
    with pytest.raises(SystemExit, match=r"4 finished runs[\s\S]*resfl-s1: federation.rounds: 2 -> 3"):
        main([*args[:-1], "federation.rounds=3"])
    assert (out / "resfl-s1" / "table_wall_s.json").read_text() == before


@pytest.mark.slow
def test_the_audit_in_run_gives_the_audit_runs_columns(adult_dir: Path, tmp_path: Path):
    """The same table with --audit (an audit run per method and seed) and --audit-in-run (the audit inside the privacy
    run): every column of table.csv is equal, the audit columns included, from half the runs."""
    from resfl_lightning.cli.table import main

    common = ["--dataset", "adult", "--methods", "resfl", "--seeds", "1", "--primary-seeds", "1",
              f"dataset.root={adult_dir}", "federation.rounds=2"]
    tables = {}
    for flag in ("--audit", "--audit-in-run"):
        out = tmp_path / flag.strip("-")
        assert main([*common[:-2], flag, "--out", str(out), *common[-2:]]) == 0
        tables[flag] = {(r["method"], r["metric"]): r["mean"] for r in csv.DictReader((out / "table.csv").open())
                        if r["metric"] != "wall_s"}
        runs = sorted(p.name for p in out.iterdir() if (p / "summary.json").is_file())
        assert runs == (["fedavg-s0", "fedavg-s0-audit", "resfl-s0", "resfl-s0-audit"] if flag == "--audit"
                        else ["fedavg-s0", "resfl-s0"])
    assert tables["--audit"][("resfl", "audit_tpr_at_fpr_1")] not in ("", "nan")
    assert tables["--audit"] == tables["--audit-in-run"]


def test_settings_diff_names_every_changed_added_and_missing_leaf():
    from resfl_lightning.analysis.run_settings import settings_diff

    saved = {"dataset": {"num_images": 960, "val_fraction": 0.3, "dim_range": [0.1, 0.3]}, "seed": 0}
    now = {"dataset": {"num_images": 2824, "val_fraction": 0.3, "dim_range": [0.1, 0.4], "new": 1}, "seed": 0}
    assert settings_diff(saved, now) == ["dataset.dim_range: [0.1, 0.3] -> [0.1, 0.4]", "dataset.new: <absent> -> 1",
                                         "dataset.num_images: 960 -> 2824"]
    assert settings_diff(saved, saved) == []


def test_legacy_aware_diff_fills_added_keys_one_way_or_both():
    from resfl_lightning.analysis.run_settings import legacy_aware_diff

    old = {"metrics": {"tau": 0.5}}  # saved before metrics.min_group_size existed (legacy value 1)
    new = {"metrics": {"tau": 0.5, "min_group_size": 1}}
    assert legacy_aware_diff(old, new) == []
    assert legacy_aware_diff(old, {"metrics": {"tau": 0.5, "min_group_size": 30}}) == [
        "metrics.min_group_size: 1 -> 30"]
    # one way: a key the later config lacks stays absent; both ways: either side may predate it
    assert legacy_aware_diff(new, old) == ["metrics.min_group_size: 1 -> <absent>"]
    assert legacy_aware_diff(new, old, both_ways=True) == []
    assert legacy_aware_diff({"metrics.tau": 0.5}, {"metrics": {"tau": 0.5}}) == []  # flat or nested alike


def test_a_failed_run_does_not_stop_the_others_and_is_named(tmp_path: Path, monkeypatch):
    from resfl_lightning.analysis import runner
    from resfl_lightning.cli.table import main

    def fake_launch(overrides, log):
        return 3 if {"algorithm=resfl", "seed=0"} <= set(overrides) else 0

    monkeypatch.setattr(runner, "_launch", fake_launch)
    out = tmp_path / "t"
    with pytest.raises(SystemExit, match=r"1 of 4 runs failed[\s\S]*resfl-s0"):
        main(["--dataset", "adult", "--methods", "resfl", "--seeds", "2", "--jobs", "2", "--out", str(out)])
    finished = sorted(p.parent.name for p in out.glob("*/table_wall_s.json"))
    assert finished == ["fedavg-s0", "fedavg-s1", "resfl-s1"]  # every other run went on and finished


def test_the_audit_in_run_flag_puts_the_audit_in_every_privacy_run(tmp_path: Path, monkeypatch):
    from resfl_lightning.analysis import runner
    from resfl_lightning.cli.table import main

    launched = []
    monkeypatch.setattr(runner, "_launch", lambda overrides, log: launched.append(list(overrides)) or 3)
    with pytest.raises(SystemExit, match="2 of 2 runs failed"):
        main(["--dataset", "adult", "--methods", "resfl", "--seeds", "1", "--audit-in-run", "--out",
              str(tmp_path / "t")])
    assert len(launched) == 2 and all("attack.mia.audit=rmia" in o for o in launched)


def test_default_out_keeps_dataset_variants_apart():
    """One rule for every experiment's default folder (analysis/execute.py experiment_out)."""
    from resfl_lightning.analysis.execute import Context, experiment_out, registered

    def default_out(dataset, scenario, overrides, kind="table", *tags):
        return experiment_out(kind, Context(dataset, scenario, overrides), *tags)

    race = default_out("adult", "iid", ["dataset.root=/d", "dataset.sensitive=race"])
    sex = default_out("adult", "iid", ["dataset.root=/d", "dataset.sensitive=sex", "seed=1"])
    assert race.name == "table-adult-iid-race" and sex.name == "table-adult-iid-sex"
    assert default_out("synthetic", "group_skew", []).name == "table-synthetic-group_skew"
    own = default_out("csv", "iid", ["dataset.path=/home/me/credit.csv", "dataset.target=default"])
    assert own == Path("runs") / "table-csv-iid-default"  # a path value never becomes part of the folder name
    assert default_out("adult", "iid", ["dataset.sensitive=race"], "robustness", "n4").name == \
        "robustness-adult-iid-race-n4"
    from resfl_lightning.analysis.execute import load_experiment

    ctx = Context("adult", "iid", ["dataset.sensitive=race"])
    for name, path in registered().items():  # every experiment's default folder follows the rule
        folder = load_experiment(path).default_out(ctx).name
        assert folder.endswith("-adult-iid-race"), (name, folder)


def test_table_privacy_runs_compose_and_attack_what_the_table_reports(tmp_path: Path):
    from resfl_lightning.analysis.table import algorithm_presets, train_overrides
    from resfl_lightning.attacks.registry import read_attacks, selected
    from resfl_lightning.run_config.load import load_config
    from tests.helpers import compose_config

    for attack, enabled in (("privacy", ["mia", "aia", "eod"]), ("byzantine", ["byzantine", "eod"])):
        overrides = train_overrides("synthetic", "group_skew", "resfl_af_cluster", 2, tmp_path / "r", attack,
                                    ["seed=7"])
        cfg = compose_config(*overrides)
        load_config(cfg)
        assert [a.name for a in selected(*read_attacks(cfg.attack))] == enabled
        assert cfg.dataset.partition == "dirichlet" and cfg.ufm.cohorts == "cluster"
        assert cfg.seed == 7  # the user's overrides come last and win
        # the synthetic table's size preset applies to every method; the scenario's partition survives it
        assert cfg.model.scale == "pico" and cfg.federation.rounds == 10 and cfg.dataset.val_fraction == 0.75
    adult = train_overrides("adult", "iid", "fedavg", 0, tmp_path / "a", "privacy", [])
    assert not any(o.startswith("experiment=") for o in adult)  # no preset file: the dataset's own recipe
    # every conf/algorithm/ preset is a row, in the order the presets fix (fedavg, the baseline, first)
    assert algorithm_presets() == ["fedavg", "resfl", "resfl_af_cluster", "resfl_af_slices", "fairfed", "fedavg_dp",
                                   "puffle", "pfu_fl", "privfairfl_pre", "privfairfl_post", "curvfed", "fedsam",
                                   "fedswa", "resfl_robust", "puffle_resfl"]


@pytest.mark.parametrize("scenario", ["iid", "group_skew", "quality_skew"])
def test_retired_synthetic_table_preset_grows_validation_only(scenario):
    """v1: 520 validation images a client; training shards, test split and reserve as with the earlier 54-image
    preset (num_images 960, test 0.2, reserve 0.05, val 0.3), so only UFM's precision changes between the two."""
    from resfl_lightning.data.partition import make_federated_splits
    from tests.helpers import compose_config

    d = compose_config("experiment=table_synthetic_v1", f"scenario={scenario}").dataset
    sizes = {}
    for name, (n, test, reserve, val) in {"now": (d.num_images, d.test_fraction, d.reserve_fraction, d.val_fraction),
                                          "54": (960, 0.2, 0.05, 0.3)}.items():
        groups = np.random.default_rng(0).choice(3, size=n, p=[0.55, 0.3, 0.15])  # the generator's rough mix
        s = make_federated_splits(groups, d.num_clients, test, reserve, val, d.partition, d.dirichlet_alpha, seed=0)
        sizes[name] = (len(s.test), len(s.reserve), [len(c.train) for c in s.clients], [len(c.val) for c in s.clients])
    assert sizes["now"][:3] == sizes["54"][:3] == (192, 48, [126] * 4)
    assert sizes["now"][3] == [520] * 4 and sizes["54"][3] == [54] * 4


@pytest.mark.parametrize("scenario", ["iid", "group_skew", "quality_skew"])
def test_calibrated_synthetic_preset_sizes(scenario):
    """docs/benchmark.md: 5 clients of 64 training images (four full batches of 16) and 192 validation images, a
    test split of 480 and an attack reserve of 20 + 300 extra scenes, whatever the partition."""
    from resfl_lightning.data.partition import make_federated_splits
    from tests.helpers import compose_config

    d = compose_config("experiment=table_synthetic", f"scenario={scenario}").dataset
    groups = np.random.default_rng(0).choice(3, size=d.num_images, p=[0.42, 0.38, 0.2])  # the preset's tone mix
    s = make_federated_splits(groups, d.num_clients, d.test_fraction, d.reserve_fraction, d.val_fraction, d.partition,
                              d.dirichlet_alpha, seed=0)
    assert (len(s.test), len(s.reserve), d.extra_reserve_images) == (480, 20, 300)
    assert [len(c.train) for c in s.clients] == [64] * 5 and [len(c.val) for c in s.clients] == [192] * 5
    assert d.batch_size == 16 and not d.augment


def test_a_chosen_experiment_replaces_the_table_preset():
    from resfl_lightning.analysis.table import table_preset, train_overrides

    assert table_preset("synthetic") == ["experiment=table_synthetic"]
    assert table_preset("synthetic", ["experiment=table_synthetic_v1"]) == []
    assert table_preset("adult", []) == (["experiment=table_adult"] if table_preset("adult") else [])
    runs = train_overrides("synthetic", "iid", "fedavg", 0, Path("r"), "none", ["experiment=table_synthetic_v1"])
    assert [o for o in runs if o.startswith("experiment=")] == ["experiment=table_synthetic_v1"]


def test_pareto_labels_never_pile_up():
    from resfl_lightning.analysis.pareto import LABEL_SPOTS, place_labels

    # four methods on one spot: the four sides around it, then nothing (the legend names the fifth)
    spots = place_labels([(0.5, 0.5)] * 5, ["abcdef"] * 5)
    assert spots[:4] == [0, 1, 2, 3] and spots[4] is None and len(LABEL_SPOTS) == 4
    # far apart: every label in its first choice
    assert place_labels([(0.1, 0.1), (0.8, 0.8)], ["a", "b"]) == [0, 0]
    # a long name reaches a neighbour to its right, a short one does not
    assert place_labels([(0.1, 0.5), (0.3, 0.5)], ["x" * 30, "y"])[1] != 0
    assert place_labels([(0.1, 0.5), (0.3, 0.5)], ["x", "y"]) == [0, 0]


def test_pareto_legend_names_methods_of_either_panel_once():
    """A method with no Fairness Score appears only in the privacy panel; the legend still names it, once."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from resfl_lightning.analysis.pareto import legend_entries

    fig, axes = plt.subplots(1, 2)
    axes[0].errorbar([0.1], [0.5], fmt="o", label="fedavg")
    axes[1].errorbar([0.4], [0.5], fmt="o", label="fedavg")
    axes[1].errorbar([0.4], [0.0], fmt="s", label="pfu_fl")
    handles, labels = legend_entries(axes)
    plt.close(fig)
    assert labels == ["fedavg", "pfu_fl"] and len(handles) == 2


# --- methods and columns come from the config folder ---------------------------------------------------------------
def _write_run(run_dir: Path, summary: dict, wall_s: float) -> None:
    import json

    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "table_wall_s.json").write_text(json.dumps({"wall_s": wall_s}))


def test_columns_from_config_give_each_cell_of_a_seed(tmp_path: Path):
    """Every column of conf/table/columns.yaml on hand-made runs: summary keys, utility (mAP, else accuracy), Privacy
    Score, FATE against the FedAvg run of the same seed, BA AD against the Byzantine run, wall time."""
    from resfl_lightning.analysis.columns import load_columns
    from resfl_lightning.analysis.table import seed_metrics, seed_runs

    _write_run(tmp_path / "fedavg-s0", {"test/accuracy": 0.80, "test/eo_gap": 0.20, "test/eod": 0.1}, 10.0)
    _write_run(tmp_path / "resfl-s0", {"test/accuracy": 0.84, "test/eo_gap": 0.10, "test/eod": 0.05,
                                       "attack/mia_success_rate": 0.6, "attack/aia_balanced_accuracy": 0.4,
                                       "score/fairness": float("nan")}, 12.5)
    _write_run(tmp_path / "resfl-s0-byzantine", {"test/accuracy": 0.42}, 11.0)
    columns = load_columns()
    row = seed_metrics(tmp_path, "resfl", 0, columns, ["privacy", "byzantine"])
    assert list(row) == [c.key for c in columns]
    assert row["utility"] == 0.84 and row["test/eod"] == 0.05 and row["score/fairness"] is None  # NaN: no value
    assert row["privacy_score"] == pytest.approx(0.5) and row["wall_s"] == 12.5
    assert row["fate"] is None  # FATE is a ratio of means over seeds (test_table_statistics.py), no per-seed value
    fate = next(c for c in columns if c.key == "fate")
    assert fate.inputs(seed_runs(tmp_path, "resfl", 0, ["privacy"])) == (0.84, 0.10)
    assert row["ba_ad"] == pytest.approx(0.5) and row["dpa_eodd"] is None  # no poisoning run: no value
    assert seed_metrics(tmp_path, "resfl", 0, columns, ["privacy"])["ba_ad"] is None  # without --robustness


def test_audit_columns_read_the_audit_run_and_only_audit_adds_it(tmp_path: Path):
    """--audit adds one run per method and seed with the declared RMIA audit (attack.mia.per_client on), and the
    TPR columns read that run's summary, not the privacy run's shadow-threshold TPR."""
    from resfl_lightning.analysis.columns import load_columns
    from resfl_lightning.analysis.execute import Context
    from resfl_lightning.analysis.run_settings import composed_settings
    from resfl_lightning.analysis.table import MethodTable, seed_metrics

    _write_run(tmp_path / "resfl-s0", {"test/accuracy": 0.84, "attack/mia_tpr_at_fpr_1": 0.5}, 12.5)
    _write_run(tmp_path / "resfl-s0-audit", {"attack/mia_tpr_at_fpr_0.1": 0.002, "attack/mia_tpr_at_fpr_1": 0.03},
               13.0)
    columns = load_columns()
    row = seed_metrics(tmp_path, "resfl", 0, columns, ["privacy", "audit"])
    assert (row["audit_tpr_at_fpr_0.1"], row["audit_tpr_at_fpr_1"]) == (0.002, 0.03)
    assert seed_metrics(tmp_path, "resfl", 0, columns, ["privacy"])["audit_tpr_at_fpr_1"] is None

    table = MethodTable()
    names = {o: [r.name for r in table.plan(Context("adult", "iid", ["dataset.root=/x"], 1,
                                                    options={"methods": ["resfl"], "seeds": 1, "primary_seeds": 1,
                                                             o: True}), tmp_path)]
             for o in ("audit", "robustness")}
    assert sorted(names["audit"]) == ["fedavg-s0", "fedavg-s0-audit", "resfl-s0", "resfl-s0-audit"]
    assert not any(n.endswith("-audit") for n in names["robustness"])
    audit = next(r for r in table.plan(Context("adult", "iid", ["dataset.root=/x"], 1,
                                               options={"methods": ["resfl"], "seeds": 1, "primary_seeds": 1,
                                                        "audit": True}), tmp_path) if r.name == "resfl-s0-audit")
    mia = composed_settings(audit.overrides)["attack"]
    assert mia["enabled"] == ["mia"] and (mia["mia"]["method"], mia["mia"]["per_client"]) == ("rmia", True)


def test_audit_in_run_plans_no_audit_run_and_the_columns_read_the_privacy_runs_audit(tmp_path: Path):
    """--audit-in-run: the privacy run composes the same RMIA audit beside its shadow attack (attack.mia.audit, the
    audit run's a and per_client), no -audit run is planned, and the TPR columns read attack/mia_audit_* of the
    privacy run (not its shadow-threshold TPR); a privacy run without the audit keys leaves the columns empty."""
    from resfl_lightning.analysis.columns import load_columns
    from resfl_lightning.analysis.execute import Context
    from resfl_lightning.analysis.run_settings import composed_settings
    from resfl_lightning.analysis.table import MethodTable, seed_metrics

    options = {"methods": ["resfl"], "seeds": 1, "primary_seeds": 1, "audit": True, "audit_in_run": True}
    planned = MethodTable().plan(Context("adult", "iid", ["dataset.root=/x"], 1, options=options), tmp_path)
    assert sorted(r.name for r in planned) == ["fedavg-s0", "resfl-s0"]
    mia = composed_settings(next(r for r in planned if r.name == "resfl-s0").overrides)["attack"]
    assert mia["enabled"] == ["mia", "aia", "eod"]
    assert (mia["mia"]["method"], mia["mia"]["audit"], mia["mia"]["per_client"], mia["mia"]["rmia_offline_a"]) == (
        "shadow", "rmia", True, 0.3)

    _write_run(tmp_path / "resfl-s0", {"test/accuracy": 0.84, "attack/mia_tpr_at_fpr_1": 0.5,
                                       "attack/mia_audit_tpr_at_fpr_0.1": 0.002,
                                       "attack/mia_audit_tpr_at_fpr_1": 0.03}, 12.5)
    _write_run(tmp_path / "fedavg-s0", {"test/accuracy": 0.84, "attack/mia_tpr_at_fpr_1": 0.5}, 12.0)
    columns = load_columns()
    row = seed_metrics(tmp_path, "resfl", 0, columns, ["privacy"])
    assert (row["audit_tpr_at_fpr_0.1"], row["audit_tpr_at_fpr_1"]) == (0.002, 0.03)
    assert seed_metrics(tmp_path, "fedavg", 0, columns, ["privacy"])["audit_tpr_at_fpr_1"] is None


def test_a_column_is_one_yaml_entry_and_a_bad_one_names_its_place(tmp_path: Path):
    from resfl_lightning.analysis.columns import Column, PrivacyScore, load_columns

    path = tmp_path / "columns.yaml"
    path.write_text("columns:\n  - {header: acc, key: test/accuracy, lower_is_better: false}\n"
                    "  - {_target_: resfl_lightning.analysis.columns.PrivacyScore, header: PS, key: ps,"
                    " lower_is_better: true}\n")
    plain, derived = load_columns(path)
    assert type(plain) is Column and plain.key == "test/accuracy" and not plain.lower_is_better
    assert isinstance(derived, PrivacyScore) and derived.paired and derived.decimals == 3
    path.write_text("columns:\n  - {header: acc, key: test/accuracy, lower_is_better: false}\n"
                    "  - {_target_: resfl_lightning.analysis.columns.NoSuchColumn, header: x, key: x,"
                    " lower_is_better: true}\n")
    with pytest.raises(ValueError, match=r"columns\.yaml: columns\[1\]: .*NoSuchColumn"):
        load_columns(path)
    path.write_text("columns:\n  - {header: a, key: k, lower_is_better: false}\n"
                    "  - {header: b, key: k, lower_is_better: true}\n")
    with pytest.raises(ValueError, match="a key appears twice"):
        load_columns(path)


def test_every_algorithm_preset_is_a_row_placed_by_its_own_file(tmp_path: Path, monkeypatch):
    from resfl_lightning.analysis import table

    algo = tmp_path / "algorithm"
    algo.mkdir()
    (algo / "fedavg.yaml").write_text("name: fedavg\ntable_order: 0\n")
    (algo / "zeta.yaml").write_text("defaults: [fedavg, _self_]\nname: zeta\ntable_order: 1\n")
    (algo / "alpha.yaml").write_text("defaults: [fedavg, _self_]\nname: alpha\ntable_order: 2\n")
    monkeypatch.setattr(table, "conf_dir", lambda: tmp_path)
    assert table.algorithm_presets() == ["fedavg", "zeta", "alpha"]  # the files' order, not the alphabet
    (algo / "mine.yaml").write_text("defaults: [fedavg, _self_]\nname: mine\n")  # inherits, sets none itself
    with pytest.raises(table.ExperimentError, match=r"mine\.yaml: table_order: .*got None"):
        table.algorithm_presets()
    (algo / "mine.yaml").write_text("name: mine\ntable_order: 2\n")
    with pytest.raises(table.ExperimentError, match=r"share a row position: \{2: \['alpha', 'mine'\]\}"):
        table.algorithm_presets()


def test_a_changed_results_file_is_an_output_and_a_changed_code_file_is_not(tmp_path: Path):
    import subprocess

    from resfl_lightning.analysis.checkout import git_commit

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "t.md").write_text("old\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = git_commit(tmp_path)
    assert len(head) == 40
    (tmp_path / "docs" / "results" / "t.md").write_text("rewritten by a resumed command\n")
    (tmp_path / "new_untracked.py").write_text("")
    assert git_commit(tmp_path) == head
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit(tmp_path) == f"{head} (with uncommitted changes)"


def test_results_file_carries_its_provenance(tmp_path: Path):
    import os

    from resfl_lightning.analysis.provenance import write_results

    path = write_results(tmp_path / "docs" / "results" / "adult_iid.md", "# adult, scenario iid\n\n| method |\n",
                         "resfl table --dataset adult", wall_s=125.4, runs_wall_s=300.0)
    lines = path.read_text().splitlines()
    assert lines[0] == "# adult, scenario iid" and lines[-1] == "| method |"
    assert "- command: `resfl table --dataset adult`" in lines
    assert "- wall time: 125 s (the runs' own wall times sum to 300 s)" in lines
    commit = next(line for line in lines if line.startswith("- commit: "))
    assert len(commit.split()[2]) == 40  # a git hash (the tests run from the checkout)
    machine = next(line for line in lines if line.startswith("- machine: "))
    assert f"{os.cpu_count()} CPUs" in machine
    assert any(line.startswith("- date: 20") for line in lines)


def test_the_notes_name_the_groups_a_run_left_out_of_its_group_metrics(tmp_path: Path):
    """metrics.min_group_size: each run's summary names the test groups it left out; the table's notes say so per
    method and seed set (a run measured on every group adds no note)."""
    from resfl_lightning.analysis.columns import load_columns
    from resfl_lightning.analysis.statistics import load_statistics
    from resfl_lightning.analysis.table import note_lines, seed_record

    columns, settings = load_columns(), load_statistics()
    for seed in (0, 1):
        _write_run(tmp_path / f"fedavg-s{seed}", {"test/accuracy": 0.8, "test/groups_excluded": {"Other": 12}}, 1.0)
        _write_run(tmp_path / f"resfl-s{seed}", {"test/accuracy": 0.8}, 1.0)
    records = {m: {s: seed_record(tmp_path, m, s, columns, ["privacy"], settings) for s in (0, 1)}
               for m in ("fedavg", "resfl")}
    assert records["fedavg"][0].groups_excluded == {"Other": 12} and records["resfl"][0].groups_excluded == {}
    notes = [line for line in note_lines(records, columns) if "min_group_size" in line]
    assert notes == ["- fedavg, seeds [0, 1]: groups left out of every group metric (fewer units in the test split "
                     "than metrics.min_group_size): Other (12)"]
