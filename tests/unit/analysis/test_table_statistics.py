"""The comparison table's statistics (analysis/statistics.py, table.py): final-or-absent run values, common seeds,
the utility floor, Holm / BH families, seeds of the primary methods, power lines and verdicts."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from statsmodels.stats.multitest import multipletests

from resfl_lightning.analysis.columns import load_columns
from resfl_lightning.analysis.statistics import (
    Claim,
    SeedRecord,
    judge_claim,
    load_claims,
    load_statistics,
    power_lines,
    summarise,
)
from resfl_lightning.metrics.statistics import paired_t

SETTINGS = load_statistics()
COLUMNS = load_columns()
BY_KEY = {c.key: c for c in COLUMNS}


class _Fabric:
    is_global_zero = True
    loggers: list = []

    def log_dict(self, values, step):
        pass


def _federation(run_dir: Path, data=None):
    return SimpleNamespace(fabric=_Fabric(), config=None, data=data or SimpleNamespace(task="detection"),
                           settings=SimpleNamespace(run_dir=str(run_dir)))


def _train(run_dir: Path, rounds: list[dict]) -> dict:
    """RunFiles + AttackScores over hand-made rounds, as a run logs them; returns summary.json."""
    from callbacks.run_files import RunFiles
    from resfl_lightning.attacks.scores import AttackScores

    fed = _federation(run_dir)
    files, scores = RunFiles(run_dir), AttackScores()
    files.on_fit_start(fed, SimpleNamespace(round_idx=-1))
    for r, metrics in enumerate(rounds):
        metrics = {"round": r, **metrics}
        scores.on_round_end(fed, metrics)
        files.on_metrics(fed, r, metrics)
    files.on_fit_end(fed)
    (run_dir / "table_wall_s.json").write_text(json.dumps({"wall_s": 1.0}))
    return json.loads((run_dir / "summary.json").read_text())


# --- 1. per-run values are final or absent -------------------------------------------------------------------------
def test_a_run_whose_final_di_is_undefined_shows_na_not_an_earlier_rounds_score(tmp_path: Path):
    """Regression: the summary kept the last Fairness Score ever logged (round 0's), and the table
    showed it for a final model whose |1-DI| is undefined; EOD likewise from the round it was last defined."""
    from resfl_lightning.analysis.table import cell_text, seed_record

    good = {"test/map": 0.30, "test/map_50": 0.50}
    summary = _train(tmp_path / "fedavg-s0", [
        {**good, "test/abs_one_minus_di": 0.2, "test/delta_eop": 0.1, "test/eod": 0.05},
        {**good, "test/abs_one_minus_di": math.nan, "test/delta_eop": 0.3},  # final: DI undefined, EOD not computed
    ])
    assert summary["score/fairness"] is None and summary["test/eod"] is None and summary["test/delta_eop"] == 0.3
    assert "final round 1" in summary["missing_reasons"]["score/fairness"]
    assert "last in round 0" in summary["missing_reasons"]["test/eod"]
    record = seed_record(tmp_path, "fedavg", 0, COLUMNS, ["privacy"], SETTINGS)
    cells = summarise({"fedavg": {0: record}}, COLUMNS, SETTINGS)
    for key in ("score/fairness", "test/abs_one_minus_di", "test/eod"):
        text = cell_text(cells["fedavg"][key], BY_KEY[key])
        assert text.startswith("n/a (") and key in text, text
    assert cell_text(cells["fedavg"]["test/delta_eop"], BY_KEY["test/delta_eop"]) == "0.300"


def test_summary_keeps_the_final_rounds_values_and_the_test_majority_rate(tmp_path: Path):
    from callbacks.run_files import RunFiles, classification_majority_rate

    clients = [SimpleNamespace(val=np.array([1, 2])), SimpleNamespace(val=np.array([3]))]
    data = SimpleNamespace(task="classification", y=np.array([0, 1, 1, 0, 0, 0, 1, 0]),
                           splits=SimpleNamespace(test=np.array([4, 5, 6, 7]), clients=clients))
    assert classification_majority_rate(data) == 0.75  # test rows 4-7: labels 0, 0, 1, 0
    assert classification_majority_rate(data, "val") == pytest.approx(2 / 3)  # val rows 1, 2, 3: labels 1, 1, 0
    assert classification_majority_rate(SimpleNamespace(task="detection")) is None
    files = RunFiles(tmp_path)
    fed = _federation(tmp_path, data)
    files.on_fit_start(fed, SimpleNamespace(round_idx=-1))
    files.on_metrics(fed, 0, {"test/accuracy": 0.7, "dp/epsilon_max": 1.0, "train/loss": 3.0})
    files.on_metrics(fed, 1, {"test/accuracy": 0.8, "dp/epsilon_max": 2.0})
    files.on_fit_end(fed)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["test/accuracy"] == 0.8 and summary["dp/epsilon_max"] == 2.0
    assert summary["test/majority_class_rate"] == 0.75 and summary["missing_reasons"] == {}
    assert summary["val/majority_class_rate"] == pytest.approx(2 / 3)  # `resfl tune`'s floor on validation
    assert "train/loss" not in summary  # not a summary metric


def test_aia_ground_truth_box_fallback_is_counted_and_warned(tmp_path: Path):
    from resfl_lightning.attacks.privacy_attacks import PrivacyAttacks, earlier_fallback_rounds
    from resfl_lightning.attacks.settings import AiaSettings

    attacks = PrivacyAttacks(seed=0)
    attacks.aia = AiaSettings()
    with pytest.warns(UserWarning, match=r"AIA round 3: 4 matched persons < attack.aia.min_matched=20"):
        m = attacks._fallback_metrics(3, {"source": "ground_truth", "n_matched": 4})
    assert m == {"attack/aia_gt_box_fallback": 1.0, "attack/aia_gt_box_fallbacks": 1.0}
    m = attacks._fallback_metrics(5, {"source": "matched", "n_matched": 40})
    assert m == {"attack/aia_gt_box_fallback": 0.0, "attack/aia_gt_box_fallbacks": 1.0}
    attacks.aia = AiaSettings(boxes="ground_truth")  # asked for ground-truth boxes: no fallback
    assert attacks._fallback_metrics(6, {"source": "ground_truth", "n_matched": 0})["attack/aia_gt_box_fallback"] == 0
    # a resumed run counts the fallbacks its attack files recorded up to its checkpoint
    (tmp_path / "attacks").mkdir()
    for r, flag in ((1, 1.0), (3, 0.0), (5, 1.0), (9, 1.0)):
        (tmp_path / "attacks" / f"privacy_round_{r:04d}.json").write_text(
            json.dumps({"metrics": {"attack/aia_gt_box_fallback": flag}}))
    assert earlier_fallback_rounds(tmp_path, 5) == {1, 5}


# --- 2. common seeds, failures, the utility floor ------------------------------------------------------------------
def _record(floor: str | None = None, **values) -> SeedRecord:
    full = {c.key: None for c in COLUMNS}
    full.update({k.replace("__", "/"): v for k, v in values.items()})
    return SeedRecord(values=full, reasons={k: f"{k} undefined" for k, v in full.items() if v is None}, floor=floor,
                      fate_inputs=(full["utility"], full["test/delta_eop"]))


def test_cells_use_their_methods_seeds_and_differences_the_common_ones():
    from resfl_lightning.analysis.table import cell_text, difference_text

    base = {s: _record(utility=0.80 + 0.01 * s, score__fairness=0.50 + 0.02 * s) for s in range(3)}
    resfl = {0: _record(utility=0.82, score__fairness=0.45), 1: _record(utility=0.83, score__fairness=None),
             2: SeedRecord(failed="resfl-s2 did not finish")}
    dead = {s: SeedRecord(failed=f"curvfed-s{s} did not finish") for s in range(3)}
    cells = summarise({"fedavg": base, "resfl": resfl, "curvfed": dead}, COLUMNS, SETTINGS)
    util, fair = cells["resfl"]["utility"], cells["resfl"]["score/fairness"]
    assert util.interval.n == 2 and util.failed == 1 and "(n=2/3)" in cell_text(util, BY_KEY["utility"])
    assert util.diff.n == 2 and util.diff.mean == pytest.approx(np.mean([0.82 - 0.80, 0.83 - 0.81]))
    assert fair.interval.n == 1 and fair.diff.n == 1 and difference_text(fair) == "n/a (n=1)"
    assert cell_text(cells["curvfed"]["utility"], BY_KEY["utility"]) == "failed"
    assert cell_text(cells["fedavg"]["utility"], BY_KEY["utility"]).endswith("]")  # all seeds: no n printed


def test_runs_below_the_utility_floor_are_greyed_and_not_compared():
    from resfl_lightning.analysis.table import cell_text

    base = {s: _record(utility=0.30, test__map_50=0.5, score__fairness=0.5 + 0.01 * s) for s in range(3)}
    dead = {s: _record("mAP@50 0.001 < 0.05", utility=0.0, test__map_50=0.001, score__fairness=0.0) for s in range(3)}
    half = {s: _record("mAP@50 0.01 < 0.05" if s == 2 else None, utility=0.3, test__map_50=0.5,
                       score__fairness=0.4 + 0.01 * s) for s in range(3)}
    cells = summarise({"fedavg": base, "puffle": dead, "resfl": half}, COLUMNS, SETTINGS)
    fair = cells["puffle"]["score/fairness"]
    assert fair.interval.n == 0 and fair.not_learned == 3 and fair.diff.n == 0
    assert cell_text(fair, BY_KEY["score/fairness"]) == "(0.000 ± 0.000 [0.000, 0.000]) did not learn"
    assert cells["puffle"]["utility"].diff.n == 3  # utility itself is compared
    assert cells["resfl"]["score/fairness"].diff.n == 2 and cells["resfl"]["score/fairness"].not_learned == 1
    assert cells["puffle"]["fate"].fate.n == 0  # FATE: no common seed where both learned


def test_a_learned_run_that_detects_nothing_at_the_threshold_leaves_its_group_rates_uncompared():
    """A detector that learned a ranking (mAP@50 0.68) but scores no person >= ufm.score_threshold has TPR 0 in every
    group: its ΔEOP and EOD are 0 - 0. Before, the table compared them (CurvFed's ΔEOP 0.000, the "fairest" row, and
    FATE +5.9 from it); now they are greyed "nothing detected", out of the paired differences and FATE, while the
    run's utility and privacy values are still compared."""
    from resfl_lightning.analysis.table import cell_text, note_lines, table_lines

    def run(s, delta_eop, mia, nothing=None):
        r = _record(utility=0.5, test__map_50=0.7, test__delta_eop=delta_eop, test__eod=delta_eop,
                    attack__mia_auc=mia + 0.01 * s)
        r.no_positive = nothing
        return r

    why = "test TPR 0 in all 3 groups: nothing detected or predicted positive at the threshold"
    base = {s: run(s, 0.25 + 0.01 * s, 0.67) for s in range(3)}
    flat = {s: run(s, 0.0, 0.55, why) for s in range(3)}
    mixed = {s: run(s, 0.0 if s == 0 else 0.20 + 0.01 * s, 0.70, why if s == 0 else None) for s in range(3)}
    records = {"fedavg": base, "curvfed": flat, "resfl": mixed}
    cells = summarise(records, COLUMNS, SETTINGS)
    eop = cells["curvfed"]["test/delta_eop"]
    assert eop.interval.n == 0 and eop.diff.n == 0 and eop.not_learned == 3
    assert cell_text(eop, BY_KEY["test/delta_eop"]) == "(0.000 ± 0.000 [0.000, 0.000]) nothing detected"
    assert cells["curvfed"]["test/eod"].diff.n == 0
    assert cells["curvfed"]["attack/mia_auc"].diff.n == 3  # the privacy values are the model's: still compared
    assert cells["curvfed"]["utility"].diff.n == 3
    assert cells["curvfed"]["fate"].fate.n == 0
    assert cell_text(cells["curvfed"]["fate"], BY_KEY["fate"]) == (
        "n/a (no common seed where both runs learned and detected something)")
    assert cells["resfl"]["test/delta_eop"].interval.n == 2 and cells["resfl"]["test/delta_eop"].diff.n == 2
    assert cells["resfl"]["fate"].fate.n == 2
    notes = "\n".join(note_lines(records, COLUMNS))
    assert f"- curvfed, seed 1: nothing detected ({why}); not compared: |1-DI|, ΔEOP, EOD" in notes
    md = "\n".join(table_lines(cells, records, "# t", COLUMNS, SETTINGS, []))
    assert "(values) nothing detected: the run learned but has TPR 0 in every group" in md
    learned = {m: {s: run(s, 0.2, 0.6) for s in range(3)} for m in ("fedavg", "resfl")}
    plain = "\n".join(table_lines(summarise(learned, COLUMNS, SETTINGS), learned, "# t", COLUMNS, SETTINGS, []))
    assert "nothing detected" not in plain  # a table without such a run keeps its legend


def test_a_column_no_run_has_a_value_in_is_left_out_of_table_md_and_named(tmp_path: Path):
    import csv

    from resfl_lightning.analysis.table import csv_text, table_lines

    # A classification table: no run has mAP@50; before, table.md carried an all-n/a mAP@50 column.
    records = {m: {s: _record(utility=0.8 + 0.01 * s + d, score__fairness=0.5 - d) for s in range(3)}
               for m, d in (("fedavg", 0.0), ("resfl", 0.01))}
    cells = summarise(records, COLUMNS, SETTINGS)
    md = "\n".join(table_lines(cells, records, "# t", COLUMNS, SETTINGS, [])) + "\n"
    (tmp_path / "table.csv").write_text(csv_text(cells, COLUMNS))
    head = next(line for line in md.splitlines() if line.startswith("| method |"))
    assert "mAP@50" not in head and "Fairness Score" in head and "utility" in head
    assert "Left out, no run of this table has a value: mAP@50 (test/map_50 undefined)" in md
    assert "| method − fedavg |" in md and "mAP@50 |" not in md.split("| method − fedavg |")[1].splitlines()[0]
    rows = list(csv.DictReader((tmp_path / "table.csv").open()))
    assert {r["metric"] for r in rows} >= {"test/map_50", "utility"}  # the csv keeps every column


def test_holm_over_the_primary_family_and_bh_over_the_rest_decide_bold():
    from resfl_lightning.analysis.table import cell_text

    rng = np.random.default_rng(0)
    keys = ["utility", "score/fairness", "privacy_score", "test/delta_eop", "attack/mia_success_rate"]

    def runs(shift):
        return {s: _record(**{k.replace("/", "__"): 0.5 + shift * (i + 1) + rng.normal(0, 0.01)
                              for i, k in enumerate(keys)}) for s in range(5)}

    records = {"fedavg": runs(0.0), "resfl": runs(-0.012), "fairfed": runs(0.01), "puffle": runs(0.003)}
    cells = summarise(records, COLUMNS, SETTINGS)
    tested = [(m, k, c) for m, row in cells.items() for k, c in row.items() if c.family is not None]
    primary = [c for m, k, c in tested if m == "resfl" and k in SETTINGS.primary_columns]
    other = [c for m, k, c in tested if not (m == "resfl" and k in SETTINGS.primary_columns)]
    assert {c.family for c in primary} == {"primary"} and {c.family for c in other} == {"exploratory"}
    assert len(primary) == 3  # utility, Fairness Score, Privacy Score; no BA AD without --robustness
    for family, method in ((primary, "holm"), (other, "fdr_bh")):
        reject, adjusted, _, _ = multipletests([c.diff.p for c in family], alpha=0.05, method=method)
        assert [c.survives for c in family] == reject.tolist()
        assert [c.p_adjusted for c in family] == pytest.approx(adjusted.tolist())
    assert any(c.survives for c in other) and not all(c.survives for c in other)
    for _m, k, c in tested:  # bold means "survives its correction", nothing else
        assert cell_text(c, BY_KEY[k]).startswith("**") == c.survives
    lines = power_lines(cells, COLUMNS, SETTINGS)
    fair = next(line for line in lines if line.startswith("- Fairness Score"))
    d = cells["resfl"]["score/fairness"].diff
    assert f"{d.mean:+.4f}" in fair and f"SD {d.std:.4f}" in fair and "seeds (normal approximation" in fair


# --- 4. seeds of the primary methods -------------------------------------------------------------------------------
def test_seeds_default_from_the_config_and_primary_methods_get_more():
    from resfl_lightning.analysis.experiment import ExperimentError
    from resfl_lightning.analysis.table import method_seeds, table_runs, table_seeds

    assert table_seeds("adult", None, None, SETTINGS) == (10, 10)
    assert table_seeds("synthetic", None, None, SETTINGS) == (3, 10)
    assert table_seeds("adult", 2, None, SETTINGS) == (2, 2) and table_seeds("adult", 2, 3, SETTINGS) == (2, 3)
    assert table_seeds("synthetic", None, 5, SETTINGS) == (3, 5)
    with pytest.raises(ExperimentError, match="primary-seeds"):
        table_seeds("adult", 4, 3, SETTINGS)
    seeds = method_seeds(["fedavg", "resfl", "curvfed"], 2, 3, SETTINGS)
    assert seeds == {"fedavg": [0, 1, 2], "resfl": [0, 1, 2], "curvfed": [0, 1]}
    runs = table_runs(seeds, ["privacy", "byzantine"])
    assert len(runs) == 16 and runs[:2] == [("fedavg", 0, "privacy"), ("fedavg", 0, "byzantine")]
    assert ("curvfed", 2, "privacy") not in runs and runs[-1] == ("resfl", 2, "byzantine")


def test_mechanism_table_takes_each_method_over_its_own_seeds(tmp_path: Path):
    from resfl_lightning.analysis.table import mechanism_lines

    for method, weights in (("fedavg", [0.2, 0.4, 0.6]), ("curvfed", [0.9])):
        for s, w in enumerate(weights):
            d = tmp_path / f"{method}-s{s}"
            d.mkdir()
            (d / "metrics.jsonl").write_text(json.dumps({"round": 0, "clients/max_weight": w}) + "\n")
    lines = mechanism_lines(tmp_path, {"fedavg": [0, 1, 2], "curvfed": [0]})
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines if line.startswith("| ")
            and not line.startswith("| method")}
    header = next(line for line in lines if line.startswith("| method"))
    col = [h.strip() for h in header.split("|")[1:-1]].index("max client weight")
    assert rows["fedavg"][col] == "0.400 ± 0.200" and rows["curvfed"][col] == "0.900"


# --- 6. verdicts ---------------------------------------------------------------------------------------------------
def test_verdicts_on_the_claims_of_the_config():
    claims = {c.name: c for c in load_claims()}
    assert any(c.relative == -0.17 and c.column == "test/delta_eop" for c in claims.values())
    base = {s: _record(utility=0.8, score__fairness=0.50 + 0.01 * s, test__delta_eop=0.20 + 0.01 * s)
            for s in range(6)}
    resfl = {s: _record(utility=0.8, score__fairness=0.45 + 0.01 * s + 0.002 * (s % 2),
                        test__delta_eop=0.195 + 0.01 * s + 0.004 * (s % 2)) for s in range(6)}
    records = {"fedavg": base, "resfl": resfl}
    cells = summarise(records, COLUMNS, SETTINGS)
    fair = judge_claim(claims["RESFL lowers the Fairness Score vs FedAvg"], records, cells, COLUMNS, SETTINGS)
    assert fair.verdict == "reproduced"
    eop = judge_claim(claims["RESFL lowers ΔEOP by 17 % vs FedAvg"], records, cells, COLUMNS, SETTINGS)
    diff = paired_t({s: r.values["test/delta_eop"] for s, r in resfl.items()},
                    {s: r.values["test/delta_eop"] for s, r in base.items()})
    paper = -0.17 * np.mean([0.20 + 0.01 * s for s in range(6)])
    assert diff.high < 0 and diff.low > paper  # between 0 and the paper's effect
    assert eop.verdict == "direction reproduced, magnitude refuted" and f"{paper:+.4f}" in eop.text
    curv = judge_claim(claims["CurvFed has a positive FATE vs FedAvg"], records, cells, COLUMNS, SETTINGS)
    assert curv.verdict == "not run"
    ba = judge_claim(claims["RESFL lowers BA AD (Byzantine accuracy drop) vs FedAvg"], records, cells, COLUMNS,
                     SETTINGS)
    assert ba.verdict == "not testable"
    noisy = {s: _record(score__fairness=0.49 + 0.01 * s + (0.05 if s % 2 else -0.05)) for s in range(6)}
    res = judge_claim(Claim("x", "difference", "noisy", "score/fairness", -1, "test"), {**records, "noisy": noisy},
                      summarise({**records, "noisy": noisy}, COLUMNS, SETTINGS), COLUMNS, SETTINGS)
    assert res.verdict == "not detected" and "would decide at the observed effect" in res.text


def test_bad_statistics_settings_name_the_file_and_key(tmp_path: Path):
    path = tmp_path / "statistics.yaml"
    good = (Path(__file__).parents[3] / "conf" / "table" / "statistics.yaml").read_text()
    path.write_text(good.replace("alpha: 0.05", "alpha: 5"))
    with pytest.raises(ValueError, match=r"statistics\.yaml: alpha: must lie in \(0, 1\)"):
        load_statistics(path)
    path.write_text(good.replace("synthetic: {seeds: 3, primary_seeds: 10}", "synthetic: {seeds: 3, primary_seeds: 2}"))
    with pytest.raises(ValueError, match=r"seeds\.synthetic"):
        load_statistics(path)
    claims = tmp_path / "claims.yaml"
    claims.write_text("claims:\n  - {name: a, kind: difference, method: resfl, column: x, direction: -1, source: s,"
                      " relative: 0.2}\n")
    with pytest.raises(ValueError, match=r"claims\[0\]: relative"):
        load_claims(claims)


def test_a_claim_whose_reference_is_at_chance_is_not_testable_and_survivors_are_counted():
    """On Adult FedAvg's MIA balanced accuracy is 0.49-0.51: its interval holds chance, so "MIA -37 %" has nothing to
    lower and once read *refuted*; and a claim judged on fewer seeds than the method ran says on how many."""
    columns = COLUMNS
    mia = next(c for c in load_claims() if c.column == "attack/mia_success_rate")
    assert mia.chance == 0.5
    at_chance = {"fedavg": {s: _record(attack__mia_success_rate=0.49 + 0.01 * (s % 3)) for s in range(5)},
                 "resfl": {s: _record(attack__mia_success_rate=0.50 + 0.005 * (s % 2)) for s in range(5)}}
    res = judge_claim(mia, at_chance, summarise(at_chance, columns, SETTINGS), columns, SETTINGS)
    assert res.verdict == "not testable" and "fedavg is at chance" in res.text and "holds 0.5" in res.text
    leaking = {"fedavg": {s: _record(attack__mia_success_rate=0.70 + 0.01 * s) for s in range(5)},
               "resfl": {s: _record(attack__mia_success_rate=0.69 + 0.01 * s) for s in range(3)}
               | {s: _record(attack__mia_success_rate=None) for s in (3, 4)}}
    res = judge_claim(mia, leaking, summarise(leaking, columns, SETTINGS), columns, SETTINGS)
    assert res.verdict != "not testable" and "n = 3 of 5 seeds" in res.text
