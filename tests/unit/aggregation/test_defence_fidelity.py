"""Issue 57 item 5, defence fidelity options: FLTrust's matched root steps and its root-norm ratio, centered clipping
with a fixed tau and worker momentum (client state kept across a resume), FLAME's noise lambda; each off by default
with the rule as it was."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from resfl_lightning.aggregation.centered_clipping import PREVIOUS_KEY, CenteredClipping
from resfl_lightning.aggregation.flame import Flame
from resfl_lightning.aggregation.fltrust import FLTrust, median_client_batches
from resfl_lightning.clients.worker_momentum import MOMENTUM_KEY, WorkerMomentum
from resfl_lightning.federation.checkpoint import ServerState
from resfl_lightning.federation.root import RootPasses
from resfl_lightning.types import ClientReport
from tests.federation_helpers import run_federation, tiny_data


def reports(n: int) -> list[ClientReport]:
    return [ClientReport(client_id=i, num_samples=10, ufm_raw=0.0, ufm_ema=0.0, u=0.0, gated=False,
                         val_utility=0.8, val_utility50=0.8, eval_loss=1.0) for i in range(n)]


def data_with_reserve(num_clients: int = 4, rows_per_client: int = 80, reserve_fraction: float = 0.15, seed: int = 0):
    """tests/federation_helpers.tiny_data with an attack reserve, so the server can carve a root split."""
    return tiny_data(num_clients, rows_per_client, seed, reserve_fraction=reserve_fraction, extra_rows=60)


# --- FLTrust: matched root steps ------------------------------------------------------------------------------------
def test_root_passes_chain_reshuffled_passes_and_stop_at_the_clients_count():
    passes = RootPasses(lambda seed: [(seed, 0), (seed, 1)], first=10, batches=5)
    assert len(passes) == 5 and list(passes) == [(10, 0), (10, 1), (11, 0), (11, 1), (12, 0)]
    with pytest.raises(ValueError, match="aggregation.root_size"):
        list(RootPasses(lambda seed: [], first=0, batches=2))


def test_fltrust_rejects_an_unknown_root_steps_value_and_matched_steps_under_dp_sgd():
    with pytest.raises(ValueError, match="aggregation.root_steps"):
        FLTrust(root_steps="many")
    dp_client = SimpleNamespace(plugins=[SimpleNamespace(per_example_loss=True)])  # DP-SGD draws Poisson batches
    federation = SimpleNamespace(server_root=lambda model, layout, size: SimpleNamespace(data=None))
    layout = SimpleNamespace(parameter_mask=lambda model: torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="root_steps=matched cannot"):
        FLTrust(root_steps="matched").attach(federation, dp_client, layout)


def _fltrust_run(tmp_path: Path, name: str, root_steps: str, rounds: int = 2):
    return run_federation(tmp_path / name, num_clients=4, rounds=rounds, data=data_with_reserve(),
                          aggregator=FLTrust(root_size=12, root_steps=root_steps))


def test_matched_root_update_takes_a_clients_steps_on_the_root_split_and_its_norm_ratio_is_near_one(tmp_path):
    fed, state, rec = _fltrust_run(tmp_path, "matched", "matched")
    root = fed.aggregator.root
    client_batches = median_client_batches(root.data)
    assert len(root.data.train_loader_for(root.indices, seed=0)) == 2 < client_batches  # 12 root rows, batch 8
    assert root.steps == client_batches  # one local epoch of as many steps as the median client
    # the same update as a client's local training over those batches of the root split: reshuffled passes, pass j
    # of the round drawn from the round's root seed + j, cut at the client's count
    from resfl_lightning.env import seed_all
    from resfl_lightning.federation.local import local_train

    last = rec.thetas[-2]  # theta_G of the last round
    root.begin_round(ServerState(round_idx=0, theta=last, int_buffers=state.int_buffers), 1)
    g0 = root.update().clone()
    seed = root._seed()
    batches = [b for j in range(math.ceil(client_batches / 2)) for b in root.data.train_loader_for(root.indices,
                                                                                                    seed=seed + j)]
    model = root.model
    root.layout.load(model, last, state.int_buffers)
    model.import_local_state(None, seed=seed)
    seed_all(seed)
    model.begin_client(-1, 1)
    steps = local_train(fed.fabric, model, lambda epoch: batches[:client_batches], 1, name="reference",
                        lr_factor=fed.settings.lr_factor(1))
    assert steps == client_batches
    torch.testing.assert_close(root.layout.flatten(model) - last, g0, rtol=0, atol=0)
    # ||g_0|| / median ||d_i||, logged every round, lies in [0.5, 2] once the steps match; one pass of the root
    # split (2 steps against the clients' 8) leaves g_0 well below the clients' norms
    ratios = [m["aggregation/fltrust_root_norm_ratio"] for m in rec.metrics]
    assert len(ratios) == 2 and all(0.5 <= r <= 2 for r in ratios), ratios
    _, _, default = _fltrust_run(tmp_path, "default", "root_split")
    assert all(r < 0.5 for r in (m["aggregation/fltrust_root_norm_ratio"] for m in default.metrics))


def test_matched_steps_change_nothing_when_the_root_split_has_a_clients_batches(tmp_path):
    """Matching only adds passes: with as many root batches as a client takes, g_0 is the default's bit for bit."""
    runs = []
    for steps in ("root_split", "matched"):
        rule = FLTrust(root_size=24, root_steps=steps)
        _, state, _ = run_federation(tmp_path / steps, num_clients=4, rounds=1, aggregator=rule,
                                     data=data_with_reserve(rows_per_client=28, reserve_fraction=0.4))
        runs.append(state.theta)
        assert rule.root.steps == 3 == median_client_batches(rule.root.data)
    assert torch.equal(*runs)


# --- centered clipping: fixed tau, worker momentum -------------------------------------------------------------------
def test_centered_clipping_with_a_fixed_tau_by_hand():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.5], [0.0, -2.0]])
    rule = CenteredClipping(tau=1.0)
    rule.begin_round(SimpleNamespace(extra={}), 0)
    # v0 = 0: [3, 4] (norm 5) -> [0.6, 0.8]; [0, 0.5] kept; [0, -2] -> [0, -1]
    first = rule.aggregate(x, reports(3))
    torch.testing.assert_close(first, torch.tensor([0.6 / 3, 0.3 / 3], dtype=torch.float64))
    state = rule.end_round(ServerState(round_idx=0, theta=torch.zeros(2), int_buffers={}))
    rule.begin_round(state, 1)
    # v0 = [0.2, 0.1]: d - v0 = [2.8, 3.9] (norm 4.8010) clipped to norm 1, [-0.2, 0.4] kept, [-0.2, -2.1] clipped
    second = rule.aggregate(x, reports(3))
    a, c = np.array([2.8, 3.9]), np.array([-0.2, -2.1])
    expected = np.array([0.2, 0.1]) + (a / np.linalg.norm(a) + np.array([-0.2, 0.4]) + c / np.linalg.norm(c)) / 3
    np.testing.assert_allclose(second.numpy(), expected, rtol=1e-12)
    assert PREVIOUS_KEY in state.extra


def test_worker_momentum_over_two_rounds_by_hand_and_across_a_resume():
    beta, mask = 0.5, torch.tensor([True, True, False])  # the last coordinate a BatchNorm statistic: sent as it is
    plugin = WorkerMomentum(beta, mask)
    plugin.import_state(None)  # the client's first round: m = 0
    sent = plugin.sent_update(None, torch.tensor([2.0, 4.0, 10.0]))
    torch.testing.assert_close(sent, torch.tensor([1.0, 2.0, 10.0]))  # (1 - beta) d
    kept = plugin.export_state()
    resumed = WorkerMomentum(beta, mask)  # a new module after a restart reads the client's stored state
    resumed.import_state({k: v.clone() for k, v in kept.items()})
    sent = resumed.sent_update(None, torch.tensor([4.0, 0.0, 7.0]))
    torch.testing.assert_close(sent, torch.tensor([2.5, 1.0, 7.0]))  # 0.5 [1, 2] + 0.5 [4, 0]
    torch.testing.assert_close(resumed.export_state()[MOMENTUM_KEY], torch.tensor([2.5, 1.0]))
    with pytest.raises(ValueError, match="aggregation.worker_momentum"):
        CenteredClipping(worker_momentum=1.0)


def test_worker_momentum_is_client_state_a_resumed_run_continues_exactly(tmp_path):
    from resfl_lightning.federation.orchestrator import SimulatedCrash

    def run(name, beta, **kw):
        return run_federation(tmp_path / name, num_clients=4, rounds=3, aggregator=CenteredClipping(
            tau=0.5, worker_momentum=beta), **kw)

    fed, full, rec = run("full", 0.5)
    assert MOMENTUM_KEY in fed.client_states.get(0)
    # round 0: every client sends (1 - beta) of its update on the parameters (m = 0 before), its BatchNorm
    # statistics as they are
    plain_fed, plain, plain_rec = run("plain", 0.0)
    assert MOMENTUM_KEY not in plain_fed.client_states.get(0)
    mask = fed.aggregator.param_mask
    assert 0 < int((~mask).sum()) and torch.equal(rec.deltas[(0, 1)][~mask], plain_rec.deltas[(0, 1)][~mask])
    torch.testing.assert_close(rec.deltas[(0, 1)][mask], 0.5 * plain_rec.deltas[(0, 1)][mask], rtol=0, atol=0)
    assert not torch.equal(full.theta, plain.theta)
    with pytest.raises(SimulatedCrash):
        run("crash", 0.5, crash_after_round=0)
    _, resumed, _ = run("crash", 0.5, resume=True)
    assert torch.equal(resumed.theta, full.theta)


# --- FLAME: noise lambda -------------------------------------------------------------------------------------------
def test_flame_noise_lambda_has_std_lambda_s_and_is_seeded():
    x = torch.ones(4, 20000) + 0.01 * torch.randn(4, 20000, generator=torch.Generator().manual_seed(0))

    def flame(round_idx: int, **kw) -> Flame:
        rule = Flame(cluster_on="updates", **kw)
        rule.seed = 7
        rule.begin_round(SimpleNamespace(theta=torch.zeros(20000), extra={}), round_idx)
        return rule

    clean = Flame(cluster_on="updates").aggregate(x, reports(4))
    torch.testing.assert_close(flame(5, noise_lambda=0.0).aggregate(x, reports(4)), clean, rtol=0, atol=0)
    noisy = flame(5, noise_lambda=0.001).aggregate(x, reports(4))
    s = float(np.median(np.linalg.norm(x.double().numpy(), axis=1)))
    noise = (noisy - clean).numpy()
    assert noise.std() == pytest.approx(0.001 * s, rel=0.03) and abs(noise.mean()) < 4 * 0.001 * s / math.sqrt(20000)
    torch.testing.assert_close(flame(5, noise_lambda=0.001).aggregate(x, reports(4)), noisy, rtol=0, atol=0)
    assert not torch.equal(flame(6, noise_lambda=0.001).aggregate(x, reports(4)), noisy)  # a fresh draw per round


@pytest.mark.parametrize("kw, match", [({"noise_lambda": -0.1}, "aggregation.noise_lambda"),
                                       ({"noise_lambda": math.inf}, "aggregation.noise_lambda"),
                                       ({"noise_lambda": 0.001, "epsilon": 3.0}, "aggregation.noise_lambda and")])
def test_flame_rejects_a_bad_noise_lambda(kw, match):
    with pytest.raises(ValueError, match=match):
        Flame(**kw)


# --- defaults: the yaml files compose to the rules as they were, and older runs are not stale ----------------------
@pytest.mark.parametrize("rule, key, other", [("fltrust", "root_steps", "matched"),
                                              ("centered_clipping", "worker_momentum", 0.9),
                                              ("flame", "noise_lambda", 0.001)])
def test_a_run_saved_before_the_option_matches_only_its_legacy_value(rule, key, other):
    from omegaconf import OmegaConf

    from resfl_lightning.analysis.run_settings import ADDED_KEYS, composed_settings, saved_config_mismatch

    preset = ["dataset=synthetic", "algorithm=fedavg", f"aggregation={rule}", "seed=0", "run_dir=runs/x"]
    saved = composed_settings(preset)
    assert saved["aggregation"][key] == ADDED_KEYS[f"aggregation.{key}"]
    del saved["aggregation"][key]
    text = OmegaConf.to_yaml(OmegaConf.create(saved))
    assert saved_config_mismatch(text, preset) == []
    assert saved_config_mismatch(text, [*preset, f"aggregation.{key}={other}"]) == [
        f"aggregation.{key}: {ADDED_KEYS[f'aggregation.{key}']} -> {other}"]
