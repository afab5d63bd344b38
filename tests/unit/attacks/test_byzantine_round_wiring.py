"""Through config and the orchestrator: per_round sign flip keeps the original attackers and deltas; an omniscient
attack (IPM) reaches the aggregator as -eps x the honest mean; the attackers' weight share is logged."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from resfl_lightning.attacks.byzantine import choose_attackers, fixed_attackers
from resfl_lightning.federation.state import FlatLayout
from resfl_lightning.train import CONF_DIR


class _Recorder:
    """Spy: every client's own update (before a round transform), the round's weights and theta before / after."""

    def __init__(self):
        self.deltas, self.weights, self.theta0, self.theta1 = {}, None, None, None

    def on_fit_start(self, state):
        self.theta0 = state.theta.clone()

    def on_client_end(self, report, delta):
        self.deltas[report.client_id] = delta.clone()

    def on_round_end(self, weights, state):
        self.weights, self.theta1 = dict(weights), state.theta.clone()


def _one_round(tmp_path, name, *overrides):
    from resfl_lightning.builders import build_run

    base = ["logger=none", "progress=false", "model.scale=femto", "dataset.num_images=40", "dataset.image_size=64",
            "dataset.extra_reserve_images=0", f"dataset.cache_dir={tmp_path / 'cache'}", "federation.rounds=1",
            "eval.every=100", f"run_dir={tmp_path / name}", *overrides]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=list({o.split("=", 1)[0]: o for o in base}.values()))
    job = build_run(cfg)
    spy = _Recorder()
    job.federation.fabric._callbacks.append(spy)
    job.fit()
    torch.set_num_threads(1)
    return spy, job.federation


def _is_param(fed) -> torch.Tensor:
    client = fed.client_factory()
    layout = FlatLayout.of(client)
    params = dict(client.named_parameters())
    return torch.cat([torch.full((s.numel(),), k in params) for k, s in zip(layout.float_keys, layout.shapes)])


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return _one_round(tmp_path_factory.mktemp("clean"), "clean", "attack=clean")[0]


def test_per_round_sign_flip_is_the_original_attack(tmp_path, clean):
    attacked, fed = _one_round(tmp_path, "byz", "attack=byzantine", "attack.byzantine.fraction=0.5",
                               "attack.byzantine.gamma=2.0", "attack.byzantine.schedule=per_round")
    attackers = choose_attackers(4, 0.5, 0, 0)
    is_param = _is_param(fed)
    for cid in range(4):
        c, a = clean.deltas[cid], attacked.deltas[cid]
        if cid in attackers:
            torch.testing.assert_close(a[is_param], -2.0 * c[is_param])
            torch.testing.assert_close(a[~is_param], c[~is_param])
        else:
            torch.testing.assert_close(a, c)
    step = sum(attacked.weights[cid] * attacked.deltas[cid].double() for cid in range(4))
    torch.testing.assert_close(attacked.theta1.double() - attacked.theta0.double(), step, atol=1e-6, rtol=1e-5)


def test_ipm_attackers_send_minus_epsilon_times_the_honest_mean(tmp_path, clean):
    attacked, fed = _one_round(tmp_path, "ipm", "attack=byzantine_ipm", "attack.byzantine.fraction=0.5",
                               "attack.byzantine.ipm_epsilon=0.5")
    attackers = fixed_attackers(4, 0.5, 0)
    honest = [c for c in range(4) if c not in attackers]
    for cid in range(4):  # clients train as in the clean run; the attack acts on the gathered round
        torch.testing.assert_close(attacked.deltas[cid], clean.deltas[cid])
    is_param = _is_param(fed)
    mean = torch.stack([clean.deltas[c].double() for c in honest]).mean(dim=0)
    sent = {}
    for cid in range(4):
        row = clean.deltas[cid].double().clone()
        if cid in attackers:
            row[is_param] = (-0.5 * mean[is_param]).float().double()
        sent[cid] = row
    step = sum(attacked.weights[cid] * sent[cid] for cid in range(4))
    torch.testing.assert_close(attacked.theta1.double() - attacked.theta0.double(), step, atol=1e-6, rtol=1e-5)
    last = json.loads((fed.settings.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["attack/byzantine_weight_share"] == pytest.approx(sum(attacked.weights[c] for c in attackers))


def test_alie_with_one_honest_update_leaves_the_round_alone_and_says_so(tmp_path, clean):
    """ALIE needs the honest updates' spread; with one honest update it used to end the run (README commands at
    small client counts). Now the attackers send their own updates that round, with a warning."""
    with pytest.warns(RuntimeWarning, match="needs the spread of at least 2 honest updates"):
        attacked, _ = _one_round(tmp_path, "alie", "attack=byzantine_alie", "attack.byzantine.fraction=0.75")
    step = sum(attacked.weights[cid] * clean.deltas[cid].double() for cid in range(4))
    torch.testing.assert_close(attacked.theta1.double() - attacked.theta0.double(), step, atol=1e-6, rtol=1e-5)


def test_optimal_ipm_searches_on_the_configured_rule_and_logs_what_it_chose(tmp_path, clean):
    """The calibrated kinds reach the run's own rule (here the coordinate median): the attackers send -eps x the
    honest mean with the eps the search logged, the round applies the median of that stack, and the logged deviation
    is how far that median lies from the honest mean on the attacked coordinates."""
    attacked, fed = _one_round(tmp_path, "optimal_ipm", "attack=byzantine_optimal_ipm", "aggregation=median",
                               "attack.byzantine.search_evals=6")
    last = json.loads((fed.settings.run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    eps = last["attack/byzantine_strength"]
    attackers = fixed_attackers(4, 0.25, 0)
    honest = [c for c in range(4) if c not in attackers]
    is_param = _is_param(fed)
    mean = torch.stack([clean.deltas[c].double() for c in honest]).mean(dim=0)
    sent = torch.stack([clean.deltas[c] for c in range(4)])
    for cid in attackers:
        sent[cid, is_param] = (-eps * mean[is_param]).float()
    median = sent.double().sort(dim=0).values[1:3].mean(dim=0)  # four updates: the mean of the middle two
    torch.testing.assert_close(attacked.theta1.double() - attacked.theta0.double(), median, atol=1e-6, rtol=1e-5)
    assert eps >= 0.1 and last["attack/byzantine_deviation"] == pytest.approx(
        float((median[is_param] - mean[is_param]).norm()), rel=1e-5)
