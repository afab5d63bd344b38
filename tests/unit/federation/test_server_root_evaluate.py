"""The server's evaluation of an update on its root split (federation/root.py, read by resfl_robust) is a function of
(theta_G, round, update) alone. It used to read the live module's client id and round, i.e. the client this rank
happened to train last: its bootstrap SE (what mode=checked compares reports against) then differed between ranks
and between the first and later evaluations of a round."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from resfl_lightning.train import CONF_DIR


def _root(tmp_path, adult_dir):
    from resfl_lightning.builders import build_run

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["dataset=adult", f"dataset.root={adult_dir}", "algorithm=resfl_robust",
                                          "aggregation.mode=checked", "dataset.num_clients=4", "logger=none",
                                          "progress=false", "federation.rounds=1", "eval.every=100",
                                          f"run_dir={tmp_path / 'run'}"])
    job = build_run(cfg)
    job.fit()
    torch.set_num_threads(1)
    return job.federation.aggregator.root


def _new_round(root) -> None:
    """The same round begun again: forgets the round's evaluations, keeps theta_G and the round."""
    root.begin_round(SimpleNamespace(theta=root.theta, int_buffers=root.int_buffers), root.round_idx)


def test_the_root_evaluation_ignores_which_client_the_module_trained_last_and_is_read_back(tmp_path, adult_dir):
    root = _root(tmp_path, adult_dir)
    model = root.model
    delta = 1e-3 * torch.randn(root.theta.shape, generator=torch.Generator().manual_seed(0))
    seen = []
    for client_id, round_idx in [(2, 0), (3, 0), (1, 5)]:  # the module as different ranks / rounds leave it
        _new_round(root)
        model.client_id, model.round_idx = client_id, round_idx
        result = root.evaluate(delta)
        assert (model.client_id, model.round_idx) == (client_id, round_idx)  # restored for whoever reads it next
        seen.append(result)
    assert math.isfinite(seen[0].ufm_se) and seen[0].ufm_se > 0
    for other in seen[1:]:
        assert other.ufm_se == seen[0].ufm_se and other.ufm_raw == seen[0].ufm_raw
        assert other.utility == seen[0].utility

    calls = []
    evaluate = model.evaluate
    model.evaluate = lambda loader: calls.append(1) or evaluate(loader)
    try:
        _new_round(root)
        first = root.evaluate(delta)
        again = root.evaluate(delta.clone())  # the same values in another tensor: read back
        other = root.evaluate(2 * delta)
    finally:
        del model.evaluate
    assert again is first and len(calls) == 2
    assert other.utility != first.utility or other.ufm_raw != first.ufm_raw
    assert first.ufm_se == seen[0].ufm_se  # what was read back is what a fresh evaluation gives
