"""se_and_spread_by_size: the validation-size measurement of UFM's noise against its spread across clients."""

from __future__ import annotations

import numpy as np
import pytest

from resfl_lightning.analysis.ufm_valsize import se_and_spread_by_size
from resfl_lightning.metrics.ufm import ufm_from_units


def test_identical_images_have_no_noise_and_the_spread_is_the_clients_ufm_std():
    # every image of a client carries the same group evidence: any subset has the client's UFM, the SE is 0
    units = {0: [{0: 4.0, 1: 2.0}] * 30, 1: [{0: 4.0, 1: 4.0}] * 30, 2: [{0: 2.0, 1: 4.0}] * 30}
    per_client = [ufm_from_units(v).ufm for v in units.values()]
    rows = se_and_spread_by_size(units, sizes=[5, 20, 31], draws=3)
    assert [r["n"] for r in rows] == [5, 20]  # 31 is more images than a client has
    for r in rows:
        assert r["se"] == pytest.approx(0.0, abs=1e-12)
        assert r["spread"] == pytest.approx(np.std(per_client)) and r["se_over_spread"] == pytest.approx(0.0)


def test_more_validation_images_shrink_the_bootstrap_se():
    rng = np.random.default_rng(1)
    units = {c: [{0: float(rng.gamma(4.0)), 1: float(rng.gamma(2.0 + c))} for _ in range(400)] for c in range(4)}
    rows = se_and_spread_by_size(units, sizes=[25, 100, 400], draws=4)
    se = [r["se"] for r in rows]
    assert se[0] > se[1] > se[2] > 0
    assert se[2] == pytest.approx(se[0] / 4, rel=0.35)  # ~1/sqrt(n): 16x the images, a quarter of the SE


@pytest.mark.slow
def test_cli_on_a_run_reproduces_the_clients_own_validation_ufm(tmp_path, capsys):
    """On the run's own validation split, the CLI's UFM per client equals what the client's evaluate() reports."""
    import json

    from omegaconf import OmegaConf

    from resfl_lightning.builders import build_client
    from resfl_lightning.cli.train import run
    from resfl_lightning.cli.ufm_valsize import main
    from resfl_lightning.data.federated import build_federated_data
    from resfl_lightning.models.export import load_evidential
    from tests.helpers import compose_config

    run_dir = tmp_path / "run"
    run(compose_config("logger=none", "progress=false", "model.scale=femto", "dataset.num_images=160",
                       "dataset.val_fraction=0.5",
                       "dataset.extra_reserve_images=0", f"dataset.cache_dir={tmp_path / 'cache'}",
                       "federation.rounds=1", "scenario=quality_skew", "ufm.score_threshold=0.0",
                       "ufm.iou_threshold=0.05", f"run_dir={run_dir}"))  # low thresholds: an untrained model matches
    cfg = OmegaConf.load(run_dir / "config.yaml")
    capsys.readouterr()  # the training run's own output
    assert main([str(run_dir), "--images", str(cfg.dataset.num_images), "--val-fraction",
                 str(cfg.dataset.val_fraction), "--sizes", "2", "--draws", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    data = build_federated_data(cfg.dataset, seed=cfg.seed, printer=lambda *_: None)
    client = build_client(cfg, data)
    client.model.load_state_dict(load_evidential(run_dir / "export" / "global.pt")[0].state_dict())
    for c in range(data.num_clients):
        expected = client.evaluate(data.val_loader(c)).ufm_raw
        assert out["ufm_all_images"][str(c)] == pytest.approx(expected, abs=1e-6)
    assert len({round(v, 6) for v in out["ufm_all_images"].values()}) > 1  # not the trivial all-zero UFM
    assert [r["n"] for r in out["by_size"]] == [2]
