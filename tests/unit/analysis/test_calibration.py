"""The benchmark card's calibration (analysis/calibration.py): the attacked partner is the sign flip with gamma = n/f
and differs from its clean run only in the attack; each phenomenon's verdict is decided on its interval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resfl_lightning.analysis.calibration import BA_AD, Calibration, Phenomenon, load_card, verdict
from resfl_lightning.analysis.execute import Context, Runs
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.run_settings import composed_settings
from resfl_lightning.metrics.statistics import t_test
from resfl_lightning.resources import conf_dir


def test_the_registered_card():
    card = load_card(conf_dir() / "table" / "calibration.yaml")
    assert card.method == "fedavg" and card.fraction == 0.2
    assert not set(card.seeds) & set(card.check_seeds)
    floors = {p.key: p.at_least for p in card.phenomena}
    assert floors == {"test/delta_eop": 0.15, "test/abs_one_minus_di": None, "attack/aia_balanced_accuracy": 0.6,
                      "attack/mia_auc": 0.6, BA_AD: 0.5, "test/map_50": 0.5, "score/fairness": None,
                      "attack/mia_success_rate": None}
    assert card.paired_sd_factor == pytest.approx(2 ** 0.5, abs=1e-4)


def test_power_lines_scale_the_detectable_effect_by_the_paired_sd_and_price_the_claims():
    """Hand case: ΔEOP values 0.2, 0.3, 0.4 (mean 0.3, SD 0.1), paired SD 2 x 0.1; synthetic's table seeds 3 / 10.
    At 10 seeds the smallest detectable d_z is 0.9952 (statsmodels' TTestPower), so the difference is 0.199; the
    paper's -17 % is -0.051, d_z 0.255, which needs seeds_for_power(0.255) seeds."""
    from statsmodels.stats.power import TTestPower

    from resfl_lightning.analysis.calibration import power_lines
    from resfl_lightning.metrics.statistics import seeds_for_power

    card = load_card(conf_dir() / "table" / "calibration.yaml")
    card = type(card)(**{**card.__dict__, "paired_sd_factor": 2.0})
    values = {p.key: {} for p in card.phenomena}
    values["test/delta_eop"] = {1: 0.2, 2: 0.3, 3: 0.4}
    lines = power_lines(card, "synthetic", values)
    rows = [line for line in lines if line.startswith("| ")]
    assert rows[0].startswith("| phenomenon | key | mean | paired SD | smallest difference at 3 seeds | "
                              "smallest difference at 10 seeds |")
    (row,) = [r for r in rows if "test/delta_eop" in r]
    cells = [c.strip() for c in row.strip("|").split("|")]
    solver = TTestPower()
    assert cells[2:4] == ["0.300", "0.200"]
    assert float(cells[4]) == pytest.approx(0.2 * solver.solve_power(nobs=3, alpha=0.05, power=0.8), abs=6e-4)
    assert float(cells[5]) == pytest.approx(0.2 * solver.solve_power(nobs=10, alpha=0.05, power=0.8), abs=6e-4)
    assert f"-0.051 needs {seeds_for_power(0.051 / 0.2)} seeds" in cells[6]
    assert all("test/abs_one_minus_di" not in r for r in rows)  # no values: no row


def test_the_partner_is_the_sign_flip_with_gamma_n_over_f_and_only_the_attack_differs(tmp_path: Path):
    exp = Calibration(conf_dir() / "table" / "calibration.yaml")
    ctx = Context("adult", "iid", ["dataset.num_clients=5"], 1)
    planned = {r.name: r for r in exp.plan(ctx, tmp_path)}
    assert sorted(planned) == sorted(f"{k}-s{s}" for s in (200, 201, 202) for k in ("clean", "sign_flip"))
    attacked = composed_settings(planned["sign_flip-s200"].overrides)
    assert attacked["algorithm"]["name"] == "fedavg" and attacked["dataset"]["num_clients"] == 5
    byz = attacked["attack"]["byzantine"]
    assert (byz["kind"], byz["fraction"], byz["gamma"]) == ("sign_flip", 0.2, 5.0)  # f = 1 of n = 5
    assert exp.unpaired_plan(ctx, tmp_path, list(planned.values())) == []
    check = Context("adult", "iid", [], 1, options={"check": True})
    assert exp.seeds(check) == list(range(210, 220))


def test_verdicts_are_decided_on_the_interval():
    floor = Phenomenon("gap", "k", 0.15, 0.05)
    assert verdict(t_test([0.30, 0.32, 0.31]), floor) == "clears 0.15; SD <= 0.05"
    assert verdict(t_test([0.10, 0.30]), floor).startswith("mean clears 0.15, interval does not; SD > 0.05")
    assert verdict(t_test([0.10, 0.11, 0.12]), floor).startswith("below 0.15")
    assert verdict(t_test([0.3]), floor) == "n/a (fewer than 2 seeds)"
    assert verdict(t_test([0.3, 0.4]), Phenomenon("di", "k", None)) == "reported"


def test_ba_ad_is_the_pairs_relative_drop(tmp_path: Path):
    exp = Calibration(conf_dir() / "table" / "calibration.yaml")
    for name, summary in (("clean-s200", {"test/map": 0.4, "test/delta_eop": 0.2}),
                          ("sign_flip-s200", {"test/map": 0.1})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    values = exp.values(Runs(tmp_path, [], [], 0.0), [200, 201])
    assert values[BA_AD] == {200: pytest.approx(0.75), 201: None}  # (0.4 - 0.1) / 0.4; seed 201 never ran
    assert values["test/delta_eop"] == {200: 0.2, 201: None}


def test_overlapping_seeds_are_refused(tmp_path: Path):
    text = (conf_dir() / "table" / "calibration.yaml").read_text().replace("check_seeds: [210,", "check_seeds: [200,")
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ExperimentError, match="disjoint"):
        load_card(tmp_path / "c.yaml")
