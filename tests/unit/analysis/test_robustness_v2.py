"""The version-2 robustness grid (conf/table/robustness_v2.yaml, docs/robustness-protocol.md "Version 2"): attacks
restricted to the rules they read, subsets with their own seeds, run overrides and decision keys, and the harm bar
that leaves criterion 1 undecidable where no attack hurts the baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.robustness_criteria import decide, harm_gate
from resfl_lightning.analysis.robustness_grid import (
    CLEAN,
    Cell,
    attacks_on,
    cell_overrides,
    grid_cells,
    load_grid,
    select,
)
from resfl_lightning.analysis.robustness_report import markdown
from resfl_lightning.analysis.robustness_results import cell_results, run_values
from resfl_lightning.analysis.run_data import finished_run
from resfl_lightning.resources import conf_dir

V2 = conf_dir() / "table" / "robustness_v2.yaml"
ADAPTIVE = ("adaptive_cap", "adaptive_trust", "adaptive_drift", "adaptive_report")


def v2(subset: str | None = None) -> dict:
    return select(load_grid(V2), subset)


def test_adaptive_attacks_run_against_resfl_robust_only():
    grid = v2()
    cells = grid_cells(grid)
    for attack in ADAPTIVE:
        attacked = {c.defence for c in cells if c.attack == attack}
        assert attacked and attacked <= {"resfl_robust", "resfl_robust_checked"}, attack
    assert {c.defence for c in cells if c.attack == "adaptive_report"} == {"resfl_robust_checked"}
    assert "adaptive_cap" not in attacks_on(grid, "fedavg") and "optimal_alie" in attacks_on(grid, "fedavg")
    # the published grid names no restriction: every attack on every defence
    assert attacks_on(load_grid(), "fedavg") == list(load_grid()["attacks"])


def test_an_attack_restricted_to_an_unknown_defence_is_named():
    grid = load_grid(V2)
    grid["attacks"]["adaptive_cap"] = {**grid["attacks"]["adaptive_cap"], "defences": ["resfl_robustt"]}
    with pytest.raises(ExperimentError, match=r"attacks\.adaptive_cap\.defences: unknown defences \['resfl_robustt'\]"):
        select(grid, None)


def test_a_subset_sets_its_seeds_run_overrides_and_decision_keys():
    main, partial, detection = v2(), v2("partial"), v2("detection")
    assert main["seeds"] == 8 and main["decision"]["selection_seeds"] == [0, 1, 2]
    assert partial["seeds"] == 5 and partial["decision"]["evaluation_seeds"] == [1, 2, 3, 4]
    assert partial["decision"]["baseline_harm"] == main["decision"]["baseline_harm"]  # merged, not replaced
    assert detection["clients"] == 5 and detection["decision"]["selection_seeds"] == [0]
    # the participation override is in the clean run and the attacked run alike, so the pair differs in the attack
    clean = cell_overrides(partial, Cell("median", CLEAN, "honest", 0.0))
    attacked = cell_overrides(partial, Cell("median", "optimal_alie", "honest", 0.2))
    assert "federation.clients_per_round=5" in clean and "federation.clients_per_round=5" in attacked
    assert not any("clients_per_round" in o for o in cell_overrides(main, Cell("median", CLEAN, "honest", 0.0)))


def test_every_v2_cell_kind_composes_and_passes_the_schema():
    """A typo in robustness_v2.yaml (an option no rule has, an attack preset that does not exist, an adaptive attack
    on a rule it cannot read) fails here, not hours into the grid."""
    from resfl_lightning.analysis.robustness_grid import train_overrides
    from resfl_lightning.analysis.run_settings import composed_settings
    from resfl_lightning.run_config.load import load_config

    for subset, dataset in ((None, "adult"), ("partial", "adult"), ("n20", "adult"), ("partial50", "adult")):
        grid = v2(subset)
        cells = [Cell(d, CLEAN, "honest", 0.0) for d in grid["defences"]]
        f = grid["fractions"][-1]
        cells += [Cell(next(d for d in grid["defences"] if a in attacks_on(grid, d)), a, "honest", f)
                  for a in grid["attacks"]]  # each attack on the first defence it runs against
        cells += [Cell(d, "optimal_alie", "honest", f) for d in grid["defences"]]  # {f}, {trim_beta}, variants
        for cell in cells:
            cfg = load_config(composed_settings(train_overrides(dataset, "iid", grid, cell, 0, Path("runs/x"), [])))
            assert cfg.dataset.num_clients == grid["clients"], (subset, cell)
            wanted = {"partial": 5, "partial50": 10}.get(subset)
            assert cfg.federation.clients_per_round == wanted, (subset, cell)


def _values(table: dict, floor: float | None) -> dict:
    return {(Cell(*k), s): {"utility": u, "eod": 0.0, "weight_share": 0.1, "floor": floor}
            for k, utils in table.items() for s, u in enumerate(utils)}


def _harm_grid(**decision) -> dict:
    grid = v2("core")
    grid["fractions"] = [0.2]
    grid["decision"] = {k: v for k, v in grid["decision"].items()
                        if k not in ("selection_seeds", "evaluation_seeds", "baseline_harm", "weight_share_margin")}
    grid["decision"].update(decision)
    return grid


CLEAN_U = [0.85, 0.84, 0.86, 0.85, 0.84]


def _table(fedavg_attacked: list[float]) -> dict:
    return {("fedavg", CLEAN, "honest", 0.0): CLEAN_U, ("resfl", CLEAN, "honest", 0.0): CLEAN_U,
            ("resfl_robust", CLEAN, "honest", 0.0): CLEAN_U,
            ("fedavg", "sign_flip_n_over_f", "honest", 0.2): fedavg_attacked,
            ("resfl_robust", "sign_flip_n_over_f", "honest", 0.2): [0.84, 0.83, 0.85, 0.84, 0.83]}


def _gate(fedavg_attacked: list[float], floor: float | None, **decision) -> str | None:
    table = _table(fedavg_attacked)
    results = cell_results(_values(table, floor), [Cell(*k) for k in table], list(range(5)), _harm_grid(**decision))
    return harm_gate(results, _harm_grid(**decision))


def test_the_harm_bar_is_met_by_a_large_drop_or_by_the_floor():
    # BA AD ~0.53 >= 0.5 (no floor known: detection-like numbers without one)
    assert _gate([0.40, 0.39, 0.41, 0.40, 0.39], None, baseline_harm=0.5) is None
    # BA AD ~0.12 < 0.5 but at the majority-class floor 0.75: (0.85 - 0.75) / 0.85 = 0.118
    assert _gate([0.75, 0.74, 0.75, 0.75, 0.74], 0.75, baseline_harm=0.5) is None
    # BA AD ~0.035, floor 0.118 not reached: undecidable, and the reason names both numbers
    why = _gate([0.82, 0.81, 0.83, 0.82, 0.81], 0.75, baseline_harm=0.5)
    assert why is not None and "BA AD 0.035" in why and "below the bar 0.5 and the floor's 0.115" in why
    # without the key the published rule is unchanged: no gate
    assert _gate([0.82, 0.81, 0.83, 0.82, 0.81], 0.75) is None


def test_an_undecidable_dataset_leaves_criterion_1_undecided_whatever_the_defence_does():
    table = _table([0.82, 0.81, 0.83, 0.82, 0.81])
    grid = _harm_grid(baseline_harm=0.5)
    results = cell_results(_values(table, 0.75), [Cell(*k) for k in table], list(range(5)), grid)
    first = decide(results, grid)[0]
    assert first.passed is None and "undecidable here" in first.text and "fedavg's worst attack" in first.detail
    # the same numbers without the gate: criterion 1 decides (resfl_robust's BA AD is tiny, but FedAvg's gap < 0.10)
    plain = decide(results, _harm_grid())[0]
    assert "undecidable" not in plain.text and plain.passed is False


def test_run_values_read_the_floor_of_each_task(tmp_path: Path):
    for name, summary, floor in (("det", {"test/map": 0.2, "test/eod": 0.1}, 0.0),
                                 ("tab", {"test/accuracy": 0.8, "test/majority_class_rate": 0.75}, 0.75)):
        run = tmp_path / name
        run.mkdir()
        (run / "summary.json").write_text(__import__("json").dumps(summary))
        (run / "metrics.jsonl").write_text("")
        assert run_values(finished_run(run))["floor"] == floor


def test_an_attacked_run_that_detects_nothing_has_no_eod_change(tmp_path: Path):
    """Before, an attacked detector that scored no person >= the threshold read EOD 0, so ΔEOD = 0 - EOD_clean looked
    like the attack made the model fairer (29 runs of the v1 detection subset)."""
    from resfl_lightning.analysis.robustness_report import nothing_detected_lines

    def run(name: str, summary: dict) -> dict:
        path = tmp_path / name
        path.mkdir()
        (path / "summary.json").write_text(__import__("json").dumps(summary))
        (path / "metrics.jsonl").write_text("")
        return run_values(finished_run(path))

    clean = run("clean", {"test/map": 0.5, "test/eod": 0.2, "test/tpr/0": 0.7, "test/tpr/1": 0.5})
    blind = run("blind", {"test/map": 0.3, "test/eod": 0.0, "test/tpr/0": 0.0, "test/tpr/1": 0.0})
    assert not clean["nothing_detected"] and clean["eod"] == 0.2
    assert blind["nothing_detected"] and blind["eod"] is None and blind["utility"] == 0.3
    cells = [Cell("fedavg", "clean", "honest", 0.0), Cell("fedavg", "sign_flip", "honest", 0.2)]
    values = {(cells[0], 0): clean, (cells[1], 0): blind, (cells[0], 1): clean,
              (cells[1], 1): run("seeing", {"test/map": 0.4, "test/eod": 0.3, "test/tpr/0": 0.5, "test/tpr/1": 0.2})}
    result = cell_results(values, cells, [0, 1], None)[cells[1]]
    assert result.delta_eod == {1: pytest.approx(0.1)} and result.ba_ad[0] == pytest.approx(0.4)
    assert nothing_detected_lines([]) == [] and "leaves out 1 runs" in nothing_detected_lines(["a-s0"])[1]


def test_markdown_says_which_cells_attack_another_rule_and_the_run_overrides():
    grid = v2("partial")
    grid["fractions"] = [0.2]
    table = {("fedavg", CLEAN, "honest", 0.0): CLEAN_U, ("resfl_robust", CLEAN, "honest", 0.0): CLEAN_U,
             ("resfl_robust", "adaptive_cap", "honest", 0.2): CLEAN_U}
    results = cell_results(_values(table, 0.75), [Cell(*k) for k in table], list(range(5)), grid)
    text = markdown(results, grid, "# t", list(range(5)))
    section = text[text.index("## f/n = 0.2: BA AD"):]
    row = next(line for line in section.splitlines() if line.startswith("| fedavg |"))
    assert row.startswith("| fedavg | n/a (attacks another rule) |"), row
    assert "every run, clean and attacked: `federation.clients_per_round=5`" in text


def test_the_command_finds_a_robustness_grid_by_name():
    from resfl_lightning.cli.robustness import grid_file

    assert grid_file("robustness") is None and grid_file("robustness_v2") == V2
    with pytest.raises(SystemExit, match="robustness grids"):
        grid_file("calibration")


def test_the_weight_share_report_names_the_cells_above_f_over_n_plus_the_margin():
    grid = _harm_grid(weight_share_margin=0.02)
    table = _table([0.40, 0.39, 0.41, 0.40, 0.39])
    table[("resfl_robust", "adaptive_cap", "honest", 0.2)] = [0.84, 0.83, 0.85, 0.84, 0.83]
    values = _values(table, 0.75)
    for s in range(5):
        values[(Cell("resfl_robust", "adaptive_cap", "honest", 0.2), s)]["weight_share"] = 0.30
        values[(Cell("resfl_robust", "sign_flip_n_over_f", "honest", 0.2), s)]["weight_share"] = 0.15
    results = cell_results(values, [Cell(*k) for k in table], list(range(5)), grid)
    text = markdown(results, grid, "# t", list(range(5)))
    assert "## Attackers' share of resfl_robust's aggregation weight (bar: f/n + 0.02)" in text
    row = next(line for line in text.splitlines() if line.startswith("| 0.2 | 0.22 |"))
    assert "(adaptive_cap/honest)" in row and row.endswith("| adaptive_cap/honest 0.300 |")  # 0.15 is under 0.22
    assert "Attackers' share" not in markdown(results, _harm_grid(), "# t", list(range(5)))  # no key: no section


def test_fltrusts_root_norm_ratio_is_reported_with_the_runs_outside_its_band():
    grid = v2("partial")
    grid["fractions"] = [0.2]
    table = {("fltrust", CLEAN, "honest", 0.0): CLEAN_U, ("fltrust", "optimal_alie", "honest", 0.2): CLEAN_U,
             ("fedavg", CLEAN, "honest", 0.0): CLEAN_U}
    values = _values(table, 0.75)
    for s in range(5):
        values[(Cell("fltrust", CLEAN, "honest", 0.0), s)]["root_ratio"] = (0.6, 1.2)
        values[(Cell("fltrust", "optimal_alie", "honest", 0.2), s)]["root_ratio"] = (0.43 if s == 3 else 0.7, 0.9)
    results = cell_results(values, [Cell(*k) for k in table], list(range(5)), grid)
    text = markdown(results, grid, "# t", list(range(5)))
    assert "| fltrust | 0.43-1.20 | 1 of 10: fltrust-optimal_alie-honest-f20-s3 |" in text
    assert "FLTrust fidelity" not in markdown(cell_results(_values(table, 0.75), [Cell(*k) for k in table],
                                                           list(range(5)), grid), grid, "# t", list(range(5)))


def test_a_subset_above_the_decided_fractions_renders_without_a_harm_check():
    grid = v2("above")  # f/n 0.3, 0.4 only: criterion 1 reads none of them; the bar must not fail the report
    table = {("fedavg", CLEAN, "honest", 0.0): CLEAN_U, ("fedavg", "optimal_alie", "honest", 0.3): CLEAN_U}
    results = cell_results(_values(table, 0.75), [Cell(*k) for k in table], list(range(5)), grid)
    assert harm_gate(results, grid) is None
    text = markdown(results, grid, "# t", list(range(5)))
    assert "## Decision rule on resfl_robust" in text
    # one line saying why, not three criteria "not decided" for pairs that exist above the rule's f/n
    assert "no f/n at or below decision.max_fraction = 0.2: the rule reads none of its cells" in text
    assert "not decided" not in text and "no lie/honest pair" not in text


def test_the_weight_share_report_keeps_the_fractions_above_the_rule_labelled_as_such():
    grid = v2("above")
    table = {("resfl_robust", CLEAN, "honest", 0.0): CLEAN_U,
             ("resfl_robust", "adaptive_cap", "honest", 0.3): [0.84, 0.83, 0.85, 0.84, 0.83]}
    values = _values(table, 0.75)
    for s in range(5):
        values[(Cell("resfl_robust", "adaptive_cap", "honest", 0.3), s)]["weight_share"] = 0.35
    results = cell_results(values, [Cell(*k) for k in table], list(range(5)), grid)
    rows = [line for line in markdown(results, grid, "# t", list(range(5))).splitlines()
            if line.startswith("| 0.3 ") or line.startswith("| 0.4 ")]
    assert rows[0].startswith("| 0.3 (above the rule's 0.2) | 0.32 |")
    assert rows[0].endswith("| adaptive_cap/honest 0.350 |")
    assert rows[1] == "| 0.4 (above the rule's 0.2) | 0.42 | n/a | n/a |"


def test_the_detection_subset_runs_at_the_calibrated_tunes_selections():
    """Pinned before the subset's first run (docs/robustness-protocol.md, Version 2): FedAvg, the rules that run
    algorithm=fedavg, and resfl_robust train with the calibrated tune's learning rates, the day's
    conf/tuned/table_synthetic/ selections; a later tune does not move them."""
    from resfl_lightning.analysis.robustness_grid import pinned_overrides, train_overrides

    grid = v2("detection")
    cells = {c.defence: c for c in grid_cells(grid) if c.attack == "sign_flip_n_over_f"}
    assert set(cells) == {"fedavg", "median", "fltrust", "resfl_robust"}
    for defence, lr in (("fedavg", "0.1"), ("median", "0.1"), ("fltrust", "0.1"), ("resfl_robust", "0.03")):
        assert pinned_overrides(grid, "synthetic", cells[defence]) == [f"optim.lr={lr}"]
    overrides = train_overrides("synthetic", "group_skew", grid, cells["fltrust"], 1, Path("out"), [])
    assert overrides[:3] == ["dataset=synthetic", "scenario=group_skew", "experiment=table_synthetic"]
    assert "optim.lr=0.1" in overrides and overrides.index("optim.lr=0.1") < overrides.index("seed=1")
