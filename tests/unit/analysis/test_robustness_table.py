"""The robustness grid (conf/table/robustness.yaml): cells as the protocol fixes them, BA AD paired with the same
defence's clean run, the worst case over attacks, and the decision rule on hand-made numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.robustness_criteria import decide
from resfl_lightning.analysis.robustness_grid import CLEAN, Cell, cell_overrides, grid_cells, load_grid, select
from resfl_lightning.analysis.robustness_report import figure_axes, markdown
from resfl_lightning.analysis.robustness_results import ba_ad, cell_results, run_values, worst_cell
from resfl_lightning.analysis.run_data import finished_run


def test_grid_follows_the_protocol():
    grid = load_grid()
    cells = grid_cells(grid)
    assert len(set(cells)) == len(cells)
    # Krum needs n >= 2f + 3 (n = 10: f <= 3), Bulyan n >= 4f + 3 (f <= 1): cells beyond are absent, not shrunk
    assert {c.fraction for c in cells if c.defence == "krum" and c.attack != CLEAN} == {0.1, 0.2, 0.3}
    assert {c.fraction for c in cells if c.defence == "bulyan" and c.attack != CLEAN} == {0.1}
    # report modes only for defences that read reports; omniscient attacks never `sent`; poisoning has none
    assert {c.report for c in cells if c.defence == "median"} == {"honest"}
    assert {c.report for c in cells if c.defence == "resfl" and c.attack == "sign_flip"} == {
        "honest", "sent", "lie", "mimic"}
    assert {c.report for c in cells if c.defence == "resfl" and c.attack == "alie"} == {"honest", "lie", "mimic"}
    assert {c.report for c in cells if c.defence == "resfl" and c.attack == "poisoning"} == {"honest"}
    assert sum(c.attack == CLEAN for c in cells) == len(grid["defences"])


def test_cell_overrides_put_the_attack_and_f_into_the_rule():
    grid = load_grid()
    krum = cell_overrides(grid, Cell("krum", "alie", "honest", 0.3))
    assert "aggregation.f=3" in krum and "attack=byzantine_alie" in krum
    assert "attack.byzantine.fraction=0.3" in krum and "dataset.num_clients=10" in krum
    assert "aggregation.beta=0.2" in cell_overrides(grid, Cell("trimmed_mean", "ipm", "honest", 0.2))
    assert "aggregation.beta=0.1" in cell_overrides(grid, Cell("trimmed_mean", "ipm", "honest", 0.1))
    clean = cell_overrides(grid, Cell("resfl", CLEAN, "honest", 0.0))
    assert "attack.byzantine.fraction=0.0" in clean
    poison = cell_overrides(grid, Cell("fedavg", "poisoning", "honest", 0.2))
    assert "attack.poisoning.fraction=0.2" in poison and not any("report" in o for o in poison)


def test_unknown_subset_is_named():
    with pytest.raises(ExperimentError, match="nope"):
        select(load_grid(), "nope")
    core = select(load_grid(), "core")
    assert set(core["defences"]) >= {"fedavg", "resfl_robust"} and core["fractions"] == [0.1, 0.2]


def test_the_n4_subset_is_the_protocols_four_clients_with_one_attacker():
    grid = select(load_grid(), "n4")
    cells = grid_cells(grid)
    attacked = [c for c in cells if c.attack != CLEAN]
    assert grid["clients"] == 4 and {c.fraction for c in attacked} == {0.25}
    assert set(grid["attacks"]) == set(load_grid()["attacks"])  # every attack, every report mode
    assert {c.report for c in attacked if c.defence == "resfl" and c.attack == "sign_flip"} == {
        "honest", "sent", "lie", "mimic"}
    assert not {"krum", "multi_krum", "bulyan"} & {c.defence for c in cells}
    overrides = cell_overrides(grid, Cell("trimmed_mean", "alie", "honest", 0.25))
    assert "dataset.num_clients=4" in overrides and "attack.byzantine.fraction=0.25" in overrides
    assert "aggregation.beta=0.25" in overrides  # trimmed mean told f / n = 1 / 4
    grid["fractions"] = [0.1]  # round(0.4) = 0 attackers: refused, not run as a clean cell
    grid["subsets"] = {"tiny": {"clients": 4, "fractions": [0.1]}}
    with pytest.raises(ExperimentError, match="no attacker among 4 clients"):
        select(grid, "tiny")


def test_the_detection_subset_is_five_clients_with_one_attacker_and_every_defence_served():
    # docs/robustness-protocol.md, amendment of 2026-11-28: at n = 10 the benchmark learns nothing; n = 5: f/n 0.2
    grid = select(load_grid(), "detection")
    cells = grid_cells(grid)
    assert grid["clients"] == 5 and {c.fraction for c in cells if c.attack != CLEAN} == {0.2}
    assert {c.defence for c in cells} == set(grid["defences"])  # Multi-Krum serves f = 1 among 5 (n >= 2f + 3)
    assert len(cells) * grid["seeds"] == 205
    assert "aggregation.f=1" in cell_overrides(grid, Cell("multi_krum", "ipm", "honest", 0.2))


def _execute(out: Path, results: Path | None = None):
    """`resfl robustness --subset core --seeds 1` through the one pipeline."""
    from resfl_lightning.analysis.execute import Context, execute
    from resfl_lightning.analysis.robustness import RobustnessGrid

    return execute(RobustnessGrid(), Context("adult", "iid", [], 1, "resfl robustness", out, results,
                                             {"subset": "core", "seeds": 1}))


def test_run_values_read_final_utility_eod_and_mean_weight_share(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"test/accuracy": 0.8, "test/eod": 0.1}))
    rows = [{"round": 0, "attack/byzantine_weight_share": 0.1}, {"round": 1, "attack/byzantine_weight_share": 0.3},
            {"round": 1, "test/accuracy": 0.8}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert run_values(finished_run(tmp_path)) == {"utility": 0.8, "eod": 0.1, "weight_share": pytest.approx(0.2),
                                                  "floor": None, "root_ratio": None,  # no such keys in this run
                                                  "nothing_detected": False}
    assert run_values(finished_run(tmp_path / "missing"))["utility"] is None


def _values(table: dict[tuple[str, str, str, float], list[float]], eod: float = 0.0) -> dict:
    """{(cell, seed): run values} from per-seed utilities."""
    out = {}
    for (d, a, r, f), utils in table.items():
        for s, u in enumerate(utils):
            out[(Cell(d, a, r, f), s)] = {"utility": u, "eod": eod if a != CLEAN else 0.0, "weight_share": 0.1}
    return out


def _grid() -> dict:
    grid = select(load_grid(), "core")
    grid["fractions"] = [0.2]
    return grid


def test_ba_ad_is_paired_with_the_same_defence_clean_run():
    table = {("fedavg", CLEAN, "honest", 0.0): [0.80, 0.84], ("fedavg", "sign_flip", "honest", 0.2): [0.40, 0.63]}
    cells = [Cell(*k) for k in table]
    res = cell_results(_values(table), cells, [0, 1])
    assert res[cells[1]].ba_ad == {0: pytest.approx(0.5), 1: pytest.approx(0.25)}
    assert ba_ad(0.0, 0.5) is None and ba_ad(None, 0.5) is None


def _decision_case(robust_lie: list[float]) -> dict:
    clean = [0.85, 0.84, 0.86]
    return {
        ("fedavg", CLEAN, "honest", 0.0): clean, ("resfl", CLEAN, "honest", 0.0): clean,
        ("resfl_robust", CLEAN, "honest", 0.0): [0.845, 0.835, 0.855],
        ("fedavg", "sign_flip", "honest", 0.2): [0.40, 0.45, 0.42],
        ("fedavg", "alie", "honest", 0.2): [0.80, 0.80, 0.80],
        ("resfl_robust", "sign_flip", "honest", 0.2): [0.83, 0.82, 0.84],
        ("resfl_robust", "sign_flip", "lie", 0.2): robust_lie,
        ("resfl_robust", "alie", "honest", 0.2): [0.80, 0.79, 0.81],
    }


def test_worst_case_and_decision_rule_on_hand_made_runs():
    table = _decision_case(robust_lie=[0.83, 0.82, 0.84])
    cells = [Cell(*k) for k in table]
    res = cell_results(_values(table), cells, [0, 1, 2])
    worst = worst_cell(res, "fedavg", 0.2)
    assert worst.cell.attack == "sign_flip"
    robust_worst = worst_cell(res, "resfl_robust", 0.2)
    assert robust_worst.cell.attack == "alie"  # 0.80/0.845 is a larger drop than the sign flip's
    criteria = decide(res, _grid())
    first, lie, utility, eod = criteria
    assert first.passed is True
    # the paired interval of (fedavg worst - robust worst) over seeds, by hand with scipy
    fed = np.array([(c - a) / c for c, a in zip([0.85, 0.84, 0.86], [0.40, 0.45, 0.42])])
    rob = np.array([(c - a) / c for c, a in zip([0.845, 0.835, 0.855], [0.80, 0.79, 0.81])])
    ci = stats.ttest_1samp(fed - rob, 0).confidence_interval(0.95)
    assert f"[{ci.low:+.3f}, {ci.high:+.3f}]" in first.detail
    assert lie.passed is True and utility.passed is True and eod.passed is True


def test_decision_rule_fails_a_liar_gain_and_says_by_how_much():
    table = _decision_case(robust_lie=[0.70, 0.69, 0.71])
    cells = [Cell(*k) for k in table]
    criteria = decide(cell_results(_values(table, eod=0.05), cells, [0, 1, 2]), _grid())
    assert criteria[1].passed is False and "sign_flip" in criteria[1].detail
    assert criteria[3].passed is False and "+0.050" in criteria[3].detail
    text = markdown(cell_results(_values(table), cells, [0, 1, 2]), _grid(), "# t", [0, 1, 2])
    assert "FAILED" in text and "| resfl_robust |" in text


def _every_defence_attacked(grid: dict, fraction: float) -> dict:
    """Cell results of one sign-flip cell per defence at `fraction`, each defence hurt a little more than the last."""
    table = {}
    for i, d in enumerate(grid["defences"]):
        table[(d, CLEAN, "honest", 0.0)] = [0.85, 0.84]
        table[(d, "sign_flip", "honest", fraction)] = [0.80 - 0.01 * i, 0.79 - 0.01 * i]
    return cell_results(_values(table), [Cell(*k) for k in table], [0, 1])


def test_figure_tells_every_defence_of_the_full_grid_apart():
    """13 defences: matplotlib's default cycle repeats its ten colours, so fedavg and flame were drawn alike; every
    line now differs from every other in colour or marker, and the decision defence is the only black one."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    grid = select(load_grid(), None)
    fig, ax = figure_axes(_every_defence_attacked(grid, 0.2), grid, "t")
    handles, labels = ax.get_legend_handles_labels()
    lines = {label: h.lines[0] if hasattr(h, "lines") else h for h, label in zip(handles, labels)}
    styles = {d: (to_hex(lines[d].get_color()), lines[d].get_marker()) for d in grid["defences"]}
    plt.close(fig)
    assert len(set(styles.values())) == len(grid["defences"]) == 13
    rule = grid["decision"]
    assert [d for d, (c, _) in styles.items() if c == "#000000"] == [rule["defence"]]


def test_a_grid_of_one_fraction_puts_the_defences_side_by_side():
    """The n4 subset has one f/n: on an f/n axis every defence sat on one point, their intervals on top of each
    other; each served defence now has its own x position, labelled with its name."""
    import matplotlib.pyplot as plt

    grid = select(load_grid(), "n4")
    fig, ax = figure_axes(_every_defence_attacked(grid, 0.25), grid, "t")
    handles, names = ax.get_legend_handles_labels()
    xs = [tuple(h.lines[0].get_xdata()) for h, name in zip(handles, names) if name in grid["defences"]]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    plt.close(fig)
    assert sorted(xs) == [(float(i),) for i in range(len(grid["defences"]))]
    assert labels == list(grid["defences"]) and "f/n = 0.25" in ax.get_xlabel()


def test_markdown_says_why_a_column_has_no_run():
    """A cell the grid never runs is not a missing run: Krum at f = 4 of 10 is not served, FedAvg reads no report (its
    `lie` column is the honest run), an omniscient attack has no `sent` column; n/a is left for runs that did not
    finish. The worst case per defence and f/n heads the file."""
    grid = select(load_grid(), None)
    table = {("krum", CLEAN, "honest", 0.0): [0.85], ("krum", "sign_flip", "honest", 0.1): [0.80],
             ("fedavg", CLEAN, "honest", 0.0): [0.85], ("fedavg", "alie", "honest", 0.4): [0.425]}
    cells = grid_cells(grid)
    res = cell_results(_values(table), cells, [0])
    text = markdown(res, grid, "# t", [0])
    row = lambda section, d: next(line for line in text.split(section, 1)[1].splitlines()  # noqa: E731
                                  if line.startswith(f"| {d} |")).split(" | ")
    head = text.split("## f/n = 0.4: BA AD", 1)[1].splitlines()[2].split(" | ")
    fed, resfl, krum = (row("## f/n = 0.4: BA AD", d) for d in ("fedavg", "resfl", "krum"))
    assert fed[head.index("alie (lie)")] == "= honest" and fed[head.index("alie (honest)")] == "0.500"
    assert "alie (sent)" not in head and resfl[head.index("alie (lie)")] == "n/a"
    assert krum[head.index("sign_flip (honest)")] == "n/a (not served)"  # the protocol's n/a, with its reason
    # the issue's per-cell numbers: utility under attack, weight share, and ΔEOD = the poisoning columns' DPA EODD
    second = text.split("f/n = 0.4: utility under attack;", 1)[1]
    assert "the DPA EODD in the poisoning and label-flip columns" in second.splitlines()[0]
    fed_second = next(line for line in second.splitlines() if line.startswith("| fedavg |")).split(" | ")
    assert fed_second[head.index("alie (honest)")] == "0.425; 0.100; +0.000"
    assert "poisoning (honest)" in head
    summary = text.split("## Worst case over attacks and report modes", 1)[1].split("## Clean runs", 1)[0]
    assert "| krum | 0.059 sign_flip/honest | n/a | n/a | n/a (not served) |" in summary
    assert "0.500 alie/honest |" in summary.splitlines()[4]


def test_missing_cells_are_not_decidable():
    table = {("resfl_robust", CLEAN, "honest", 0.0): [0.84]}
    criteria = decide(cell_results(_values(table), [Cell(*k) for k in table], [0]), _grid())
    assert criteria[0].passed is None and criteria[1].passed is None


def test_every_defence_attack_and_report_mode_composes_and_passes_the_schema():
    """A typo in conf/table/robustness.yaml (a key no rule has, an attack preset that does not exist) fails here,
    not hours into a grid."""
    from resfl_lightning.analysis.robustness_grid import train_overrides
    from resfl_lightning.analysis.run_settings import composed_settings
    from resfl_lightning.run_config.load import load_config

    grid = load_grid()
    cells = {Cell(d, CLEAN, "honest", 0.0) for d in grid["defences"]}
    cells |= {Cell("resfl_robust_checked", a, "honest", 0.3) for a in grid["attacks"]}
    cells |= {Cell("resfl", "sign_flip", r, 0.2) for r in grid["report_modes"]}
    cells |= {Cell(d, "alie", "honest", 0.2) for d in ("krum", "bulyan", "trimmed_mean")}  # {f}, {trim_beta}
    for cell in sorted(cells, key=lambda c: c.name):
        cfg = load_config(composed_settings(train_overrides("adult", "iid", grid, cell, 0, Path("runs/unused"), [])))
        assert cfg.dataset.num_clients == 10, cell
        kind = "poisoning" if cell.attack == "poisoning" else "byzantine"
        assert cfg.attack[kind].fraction == cell.fraction, cell


def test_a_pinned_setting_wins_over_the_tuned_file_only_on_its_dataset():
    """The grid's runs keep the tuned settings they were made with whatever conf/tuned/ holds later: the pin comes
    after the tuned file (which composition puts first) and applies per algorithm and dataset only."""
    from resfl_lightning.analysis.robustness_grid import pinned_overrides, train_overrides
    from resfl_lightning.analysis.run_settings import composed_settings

    grid = load_grid()
    grid["pinned"] = {"adult": {"resfl": ["optim.lr=0.123", "algorithm.lambda_priv=0.7"], "fedavg": ["optim.lr=0.5"]}}
    resfl, median = Cell("resfl", CLEAN, "honest", 0.0), Cell("median", "alie", "honest", 0.2)
    assert pinned_overrides(grid, "adult", resfl) == ["optim.lr=0.123", "algorithm.lambda_priv=0.7"]
    assert pinned_overrides(grid, "adult", median) == ["optim.lr=0.5"]  # median runs algorithm=fedavg
    assert pinned_overrides(grid, "synthetic", resfl) == []
    cfg = composed_settings(train_overrides("adult", "iid", grid, resfl, 0, Path("runs/unused"), []))
    assert (cfg["optim"]["lr"], cfg["algorithm"]["lambda_priv"]) == (0.123, 0.7)
    # the file still applies the keys the pin leaves to it (and records itself); none left: nothing of it applies
    from resfl_lightning.run_config.tuned import load_tuned, override_key, tuned_path

    path = tuned_path("adult", "resfl")
    left = {override_key(o) for o in load_tuned(path).overrides} - {"optim.lr", "algorithm.lambda_priv"} \
        if path.is_file() else set()
    recorded = composed_settings(["dataset=adult", "algorithm=resfl"])["tuned_file"]
    assert cfg["tuned_file"] == (recorded if left else None)
    mine = composed_settings(train_overrides("adult", "iid", grid, resfl, 0, Path("runs/unused"), ["optim.lr=0.2"]))
    assert mine["optim"]["lr"] == 0.2  # the command line still wins


def test_the_run_ledger_carries_what_run_values_reads(tmp_path, monkeypatch):
    from resfl_lightning.analysis import run_ledger

    run_ledger.use(tmp_path / "ledger")
    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs", lambda *_, **__: [])  # only the ledger spec
    _execute(tmp_path / "out")
    run = tmp_path / "m1" / "exp" / "fedavg-s0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"test/accuracy": 0.8, "test/eod": 0.1}))
    rows = [{"round": 0, "attack/byzantine_weight_share": 0.1, "client/0/ufm_raw": 2.0,
             "aggregation/fltrust_root_norm_ratio": 1.5},
            {"round": 1, "attack/byzantine_weight_share": 0.3, "aggregation/fltrust_root_norm_ratio": 0.4}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    run_ledger.active().record(run, [])
    restored = tmp_path / "m2" / "exp" / "fedavg-s0"
    for name, text in run_ledger.Ledger(tmp_path / "ledger").entries("exp")["fedavg-s0"]["files"].items():
        (restored / name).parent.mkdir(parents=True, exist_ok=True)
        (restored / name).write_text(text)
    expected = {"utility": 0.8, "eod": 0.1, "weight_share": pytest.approx(0.2), "floor": None,
                "root_ratio": (0.4, 1.5), "nothing_detected": False}
    assert run_values(finished_run(restored)) == run_values(finished_run(run)) == expected
    assert "ufm_raw" not in (restored / "metrics.jsonl").read_text()


def test_the_results_header_sums_the_runs_own_wall_times(tmp_path, monkeypatch):
    """A grid restored from the ledger takes seconds to tabulate; the header also gives what its runs cost."""
    from resfl_lightning.analysis import run_ledger

    run_ledger.use(None)

    def finish(jobs, workers, **_):
        for run_dir, _ in jobs:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "summary.json").write_text(json.dumps({"test/accuracy": 0.8, "test/eod": 0.1}))
            (run_dir / "table_wall_s.json").write_text(json.dumps({"wall_s": 2.5}))
        return []

    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs", finish)
    results = tmp_path / "docs" / "robustness.md"
    _execute(tmp_path / "out", results)
    runs = len(list((tmp_path / "out").glob("*/table_wall_s.json")))
    assert runs > 10
    assert f"the runs' own wall times sum to {2.5 * runs:.0f} s" in results.read_text().split("\n## ")[0]


def test_a_pair_may_differ_in_the_attack_and_the_assumed_f_only():
    from resfl_lightning.analysis.robustness_pairing import assumed_f_keys, pair_mismatch

    grid = load_grid()
    assert assumed_f_keys(grid, "krum") == {"aggregation.f"} and assumed_f_keys(grid, "fedavg") == set()
    clean = {"seed": 0, "run_dir": "runs/a", "optim": {"lr": 0.03}, "aggregation": {"f": 0},
             "attack": {"byzantine": {"fraction": 0.0}}}
    attacked = {"seed": 0, "run_dir": "runs/b", "optim": {"lr": 0.03}, "aggregation": {"f": 2},
                "attack": {"byzantine": {"fraction": 0.2, "report": "lie"}}}
    assert pair_mismatch(clean, attacked, {"aggregation.f"}) == []
    assert pair_mismatch(clean, attacked, set()) == ["aggregation.f: 0 -> 2"]
    retuned = {**attacked, "optim": {"lr": 0.01}}
    assert pair_mismatch(clean, retuned, {"aggregation.f"}) == ["optim.lr: 0.03 -> 0.01"]
    # a key added between the two trainings (run_settings.ADDED_KEYS) pairs at its legacy value only, either way round
    later = {**attacked, "metrics": {"min_group_size": 1}}
    assert pair_mismatch(clean, later, {"aggregation.f"}) == pair_mismatch(later, clean, {"aggregation.f"}) == []
    assert pair_mismatch(clean, {**later, "metrics": {"min_group_size": 30}}, {"aggregation.f"}) == [
        "metrics.min_group_size: 1 -> 30"]


def _fake_grid_runs(out: Path, grid: dict, lr_of) -> None:
    import yaml

    for cell in grid_cells(grid):
        run = out / f"{cell.name}-s0"
        run.mkdir(parents=True, exist_ok=True)
        (run / "summary.json").write_text(json.dumps({"test/accuracy": 0.8}))
        (run / "config.yaml").write_text(yaml.safe_dump({"seed": 0, "optim": {"lr": lr_of(cell)},
                                                         "attack": {"name": cell.attack}}))


def test_an_attacked_run_trained_with_other_settings_than_its_clean_run_is_named(tmp_path):
    """88 attacked runs of the Adult IID grid were trained at lr 0.01 while their clean partners ran at 0.03 (a
    re-tune between them); reading the grid must refuse them, naming each."""
    from resfl_lightning.analysis.robustness_pairing import unpaired_runs

    grid = select(load_grid(), "core")
    cells = grid_cells(grid)
    _fake_grid_runs(tmp_path, grid, lambda c: 0.03)
    assert unpaired_runs(grid, cells, [0], tmp_path) == []
    _fake_grid_runs(tmp_path, grid, lambda c: 0.01 if c.defence == "resfl_robust" and c.attack == "ipm" else 0.03)
    lines = unpaired_runs(grid, cells, [0], tmp_path)
    assert lines and all(line.startswith("resfl_robust-ipm-") and "optim.lr: 0.03 -> 0.01" in line for line in lines)
    assert len(lines) == sum(c.defence == "resfl_robust" and c.attack == "ipm" for c in cells)


def test_every_attacked_cell_of_the_grid_composes_to_its_clean_run_but_the_attack():
    from resfl_lightning.analysis.robustness_grid import train_overrides
    from resfl_lightning.analysis.robustness_pairing import unpaired_cells
    from resfl_lightning.analysis.run_settings import composed_settings

    grid = select(load_grid(), "core")
    assert unpaired_cells(grid, grid_cells(grid), lambda c: composed_settings(
        train_overrides("adult", "iid", grid, c, 0, Path("runs/x"), []))) == []


def test_a_criterion_whose_interval_straddles_its_bound_is_not_decided():
    """The IID grid once FAILED criterion 4 on a point of +0.051 whose interval [-0.041, +0.142] held the bound."""
    from resfl_lightning.analysis.robustness_criteria import all_of, at_least, at_most
    from resfl_lightning.metrics.statistics import t_test

    straddling = t_test([-0.04, 0.05, 0.14])
    assert straddling.low < 0.02 < straddling.high
    assert at_most(straddling, 0.02) is None and at_least(straddling, 0.02) is None
    assert at_most(t_test([0.05, 0.051, 0.049]), 0.02) is False and at_most(t_test([0.0, 0.01, 0.005]), 0.02) is True
    assert at_most(t_test([0.5]), 0.02) is None  # one seed: no interval
    assert all_of([True, None]) is None and all_of([True, False, None]) is False and all_of([True, True]) is True
    table = _decision_case(robust_lie=[0.83, 0.82, 0.84])
    table[("resfl_robust", "sign_flip", "honest", 0.2)] = [0.84, 0.70, 0.85]  # noisy: its EOD varies by seed
    cells = [Cell(*k) for k in table]
    values = _values(table)
    for seed, eod in enumerate([-0.04, 0.05, 0.14]):
        values[(Cell("resfl_robust", "sign_flip", "honest", 0.2), seed)]["eod"] = eod
    eod_criterion = decide(cell_results(values, cells, [0, 1, 2]), _grid())[3]
    assert eod_criterion.passed is None and "[" in eod_criterion.detail
