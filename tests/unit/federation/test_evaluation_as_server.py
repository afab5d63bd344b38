"""The server's evaluations are functions of the model and the round alone (clients/identity.py): resfl_robust's
root-split evaluation (federation/root.py) and the global model's test pass (callbacks/evaluation.py). Both used to
run as the client the live module had trained last, whose id seeds the bootstrap SE and the k-means UFM cohorts: the
SE mode=checked compares reports against differed between ranks and between a round's first and later evaluations,
and one run's test/ufm read 0.29144 on one process and 0.29124 on two (AF-cluster, Adult, 4 clients, same model)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from resfl_lightning.train import CONF_DIR


@pytest.fixture(scope="module")
def federation(tmp_path_factory, adult_dir):
    """resfl_robust (mode=checked: its root split evaluates every update) with k-means UFM cohorts, after 1 round."""
    from resfl_lightning.builders import build_run

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["dataset=adult", f"dataset.root={adult_dir}", "algorithm=resfl_robust",
                                          "aggregation.mode=checked", "algorithm.ufm_cohorts=cluster",
                                          "dataset.num_clients=4", "logger=none", "progress=false",
                                          "federation.rounds=1", "eval.every=100",
                                          f"run_dir={tmp_path_factory.mktemp('run')}"])
    job = build_run(cfg)
    job.fit()
    torch.set_num_threads(1)
    return job.federation


def _new_round(root) -> None:
    """The same round begun again: forgets the round's evaluations, keeps theta_G and the round."""
    root.begin_round(SimpleNamespace(theta=root.theta, int_buffers=root.int_buffers), root.round_idx)


def test_the_root_evaluation_ignores_which_client_the_module_trained_last_and_is_read_back(federation):
    root = federation.aggregator.root
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


def test_the_global_test_pass_ignores_which_client_the_module_trained_last(federation):
    from resfl_lightning.callbacks.evaluation import GlobalEvaluation

    evaluation = next(c for c in federation.fabric._callbacks if isinstance(c, GlobalEvaluation))
    model = federation.aggregator.root.model  # the live module, holding whatever model it last loaded
    seen = []
    for client_id in (0, 3):  # the last client trained on rank 0 of one process / of two
        model.client_id, model.round_idx = client_id, 0
        metrics = {}
        evaluation.on_round_end(federation, 0, model, metrics)
        assert (model.client_id, model.round_idx) == (client_id, 0)
        seen.append(metrics)
    assert math.isfinite(seen[0]["test/ufm"])
    assert seen[1]["test/ufm"] == seen[0]["test/ufm"]
    assert seen[1]["test/accuracy"] == seen[0]["test/accuracy"]


def test_the_cohort_seed_keeps_every_clients_and_gives_the_server_a_valid_one():
    from sklearn.cluster import KMeans

    from resfl_lightning.clients.identity import SERVER, cohort_seed

    assert [cohort_seed(c, r) for c, r in [(0, 0), (3, 0), (2, 7), (9, 19)]] == [0, 3, 7002, 19009]
    seed = cohort_seed(SERVER, 0)
    assert seed == 2**32 - 1 and seed != cohort_seed(SERVER, 1) == 999
    KMeans(n_clusters=2, n_init=1, random_state=seed).fit([[0.0], [1.0], [5.0]])  # -1 was refused here
