"""run_mechanism: what UFM weighting had to act on in one run (the mechanism table of `make table`), on hand cases."""

from __future__ import annotations

import math

import pytest

from resfl_lightning.metrics.mechanism import run_mechanism


def test_run_mechanism_hand_case():
    rows = [
        {"round": 0, "client/0/ufm_raw": 1.0, "client/1/ufm_raw": 3.0, "client/0/ufm_se": 0.1, "client/1/ufm_se": 0.3,
         "mechanism/spearman_ufm_val_delta_eop": 0.5, "clients/max_weight": 0.6, "aggregation/gated_uniform": 0.0},
        {"round": 1, "client/0/ufm_raw": 2.0, "client/1/ufm_raw": 2.0, "client/2/ufm_raw": 2.0,
         "client/10/ufm_raw": None, "client/0/ufm_se": 0.0, "client/1/ufm_se": 0.0, "client/2/ufm_se": 0.0,
         "mechanism/spearman_ufm_val_delta_eop": None, "clients/max_weight": 0.4, "aggregation/gated_uniform": 1.0},
        {"round": 2, "client/0/ufm_raw": 0.5, "client/2/ufm_raw": 1.5, "client/3/ufm_raw": 1.0,
         "client/0/ufm_se": 0.4, "client/2/ufm_se": 0.5, "client/3/ufm_se": 0.6,
         "mechanism/spearman_ufm_val_delta_eop": -0.1, "clients/max_weight": 0.5},
        {"round": 3},  # an evaluation-only row carries no client values
    ]
    m = run_mechanism(rows)
    # round 1 ranks nothing (every client's UFM equal) and is left out of SE and spread:
    # SE medians 0.2 (round 0) and 0.5 (round 2) -> 0.35; spread std(1, 3) = 1 and std(0.5, 1.5, 1) = 0.4082 -> 0.7041
    spread = (1.0 + (1 / 6) ** 0.5) / 2
    assert m["informative_rounds"] == 2.0
    assert m["ufm_se"] == pytest.approx(0.35) and m["ufm_spread"] == pytest.approx(spread)
    assert m["se_over_spread"] == pytest.approx(0.35 / spread)
    assert m["spearman"] == pytest.approx(0.2)  # mean of 0.5 and -0.1; the undefined round is skipped, not a 0
    assert m["max_weight"] == pytest.approx(0.5) and m["gated_uniform_rounds"] == 1.0


def test_run_mechanism_without_client_values_is_nan_not_an_error():
    m = run_mechanism([{"round": 0}])
    assert math.isnan(m["ufm_se"]) and math.isnan(m["se_over_spread"]) and math.isnan(m["spearman"])
    assert m["gated_uniform_rounds"] == 0.0


def test_weights_of_quality_skewed_and_clean_clients_over_informative_rounds():
    rows = [
        {"round": 0, "client/0/ufm_raw": 0.0, "client/1/ufm_raw": 0.0, "client/2/ufm_raw": 0.0,
         "client/0/weight": 0.9, "client/1/weight": 0.05, "client/2/weight": 0.05},  # ranks nothing: left out
        {"round": 1, "client/0/ufm_raw": 2.0, "client/1/ufm_raw": 1.0, "client/2/ufm_raw": 0.5,
         "client/0/weight": 0.1, "client/1/weight": 0.3, "client/2/weight": 0.6},
        {"round": 2, "client/0/ufm_raw": 1.5, "client/1/ufm_raw": 1.0, "client/2/ufm_raw": 1.0,
         "client/0/weight": 0.2, "client/1/weight": 0.4, "client/2/weight": None},
    ]
    m = run_mechanism(rows, skewed=[0])
    assert m["weight_skewed"] == pytest.approx((0.1 + 0.2) / 2)
    assert m["weight_clean"] == pytest.approx((0.3 + 0.6 + 0.4) / 3)
    plain = run_mechanism(rows)
    assert math.isnan(plain["weight_skewed"]) and math.isnan(plain["weight_clean"])


def test_table_finds_the_quality_skewed_clients_of_a_run(tmp_path):
    from omegaconf import OmegaConf

    from resfl_lightning.analysis.report import load_rounds
    from resfl_lightning.analysis.table import quality_skewed_clients

    qs = {"client_fraction": 0.5, "group": None, "dim": 0.35, "missing_rate": 0.3}
    for seed, expected in ((0, [0, 2]), (1, [2, 3])):  # what the runs of the quality_skew table printed
        run = tmp_path / f"s{seed}"
        run.mkdir()
        (run / "metrics.jsonl").write_text('{"round": 0}\n')
        OmegaConf.save(OmegaConf.create({"seed": seed, "dataset": {"num_clients": 4, "quality_skew": qs}}),
                       run / "config.yaml")
        assert quality_skewed_clients(load_rounds(run).config) == expected
    iid = tmp_path / "iid"
    iid.mkdir()
    (iid / "metrics.jsonl").write_text('{"round": 0}\n')
    OmegaConf.save(OmegaConf.create({"seed": 0, "dataset": {"num_clients": 4}}), iid / "config.yaml")
    assert quality_skewed_clients(load_rounds(iid).config) is None
    missing = tmp_path / "no-config"
    missing.mkdir()
    (missing / "metrics.jsonl").write_text('{"round": 0}\n')
    assert quality_skewed_clients(load_rounds(missing).config) is None
