"""PUFFLE's tunable lambda (clients/parity_lambda.py) and three-part epsilon (privacy/budget.py) against
hand-computed values and opacus' accountants run independently here; the fixed mode keeps FedAvg-DP's budget."""

from __future__ import annotations

import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier

from resfl_lightning.builders import build_client
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.parity_lambda import LambdaSettings, TunableLambda, starting_lambda
from resfl_lightning.clients.parity_term import ParityTerm, dataset_parity_gap
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.config import ConfigError
from resfl_lightning.losses.parity import prediction_parity_gap
from resfl_lightning.privacy.dp import ClientDP, DPSettings, lambda_noise_for, noise_multiplier_for
from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config
from tests.unit.clients.test_tabular_client import NUM_FEATURES, NUM_GROUPS, toy_data

torch.set_num_threads(1)
SPLIT = "algorithm.dp.epsilon_split=[0.8,0.1,0.1]"


def test_round_start_lambda_is_the_rescaled_excess_over_the_target():
    assert starting_lambda(0.28, 0.1) == pytest.approx(0.18 / 0.9)
    assert starting_lambda(0.1, 0.1) == 0.0 and starting_lambda(0.02, 0.1) == 0.0
    assert starting_lambda(1.0, 0.1) == pytest.approx(1.0)


def test_lambda_follows_the_hand_computed_momentum_sequence_without_noise():
    """T = 0.1, m = 0.5, alpha_0 = 1 decayed by 0.5 once (round 1): alpha = 0.5; lambda starts at 0.18 / 0.9 = 0.2.
    gap 0.3: v = -0.2, lambda = 0.3; gap 0.2: v = -0.1 - 0.1 = -0.2, lambda = 0.4; gap 0.05: v = -0.1 + 0.05 = -0.05,
    lambda = 0.425; gap 0: v = -0.025 + 0.1 = 0.075, lambda = 0.3875."""
    tl = TunableLambda(LambdaSettings(target=0.1, momentum=0.5, alpha=1.0, alpha_decay=0.5))
    tl.begin_round(0.28, round_idx=1, seed=0)
    assert tl.alpha == 0.5 and tl.lam.item() == pytest.approx(0.2)
    expected = [(-0.2, 0.3), (-0.2, 0.4), (-0.05, 0.425), (0.075, 0.3875)]
    for gap, (v, lam) in zip([0.3, 0.2, 0.05, 0.0], expected):
        tl.step(torch.tensor(gap), sigma=None)
        assert tl.velocity.item() == pytest.approx(v) and tl.lam.item() == pytest.approx(lam)


def test_lambda_is_clipped_to_zero_one_and_the_first_round_starts_at_zero():
    tl = TunableLambda(LambdaSettings(target=0.1, momentum=0.0, alpha=4.0, alpha_decay=1.0))
    tl.begin_round(0.9, round_idx=0, seed=0)  # lambda = 0.8 / 0.9
    tl.step(torch.tensor(1.0), sigma=0.0)  # v = -0.9, lambda = 0.889 + 3.6 -> 1
    assert tl.lam.item() == 1.0
    tl.step(torch.tensor(0.0), sigma=0.0)  # v = 0.1, lambda = 1 - 0.4 = 0.6
    assert tl.lam.item() == pytest.approx(0.6)
    tl.step(torch.tensor(0.0), sigma=0.0)  # lambda = 0.2
    tl.step(torch.tensor(0.0), sigma=0.0)  # lambda = -0.2 -> 0
    assert tl.lam.item() == 0.0
    fresh = TunableLambda(tl.settings)
    assert fresh.first_round
    fresh.begin_round(None, round_idx=3, seed=0)
    assert fresh.lam.item() == 0.0 and fresh.alpha == 4.0 and not fresh.first_round


def test_noise_is_seeded_and_changes_the_update():
    settings = LambdaSettings(target=0.1, momentum=0.5, alpha=1.0, alpha_decay=1.0)
    runs = []
    for _ in range(2):
        tl = TunableLambda(settings)
        tl.begin_round(0.5, round_idx=0, seed=7)
        tl.step(torch.tensor(0.3), sigma=0.05)
        runs.append(tl.lam.item())
    plain = TunableLambda(settings)
    plain.begin_round(0.5, round_idx=0, seed=7)
    plain.step(torch.tensor(0.3), sigma=None)
    assert runs[0] == runs[1] and runs[0] != plain.lam.item()


def tabular_client(tunable: TunableLambda | None) -> TabularClient:
    torch.manual_seed(0)
    client = TabularClient(NUM_FEATURES, NUM_GROUPS, LossWeights(lambda_priv=0.0, lambda_fair=0.0),
                           UfmSettings(), OptimSettings(), hidden=(16, 8))
    client.add_plugin(ParityTerm(0.5, tunable))
    return client


def tunable_of(client: TabularClient) -> TunableLambda | None:
    """The client's tunable lambda (None: fixed mode)."""
    return client.plugin_of(ParityTerm).tunable


def test_client_uses_the_current_lambda_and_updates_it_from_the_steps_gap():
    data = toy_data(batch_size=32)
    loader = data.train_loader(0, seed=0)
    client = tabular_client(TunableLambda(LambdaSettings(target=0.05, momentum=0.5, alpha=1.0, alpha_decay=0.9)))
    client.import_local_state(None, seed=3)
    client.begin_client(0, 0)
    client.start_local_training(lambda epoch: loader)
    assert tunable_of(client).lam.item() == 0.0  # the client's first round
    batch = next(iter(loader))
    loss = client.training_step(batch, 0)
    task = client.mean_losses()["task"]
    assert loss.item() == pytest.approx(task, rel=1e-6)  # lambda 0: (1 - 0) task + 0 x gap
    gap = prediction_parity_gap(client.model(batch["x"]).logits, batch["groups"]).item()
    client.end_step()
    assert tunable_of(client).velocity.item() == pytest.approx(0.05 - gap, rel=1e-6)
    assert tunable_of(client).lam.item() == pytest.approx(min(max(0.0 - (0.05 - gap), 0.0), 1.0), rel=1e-6)

    # The next round, as the orchestrator runs it: state out, a fresh module's state in, lambda from D_train
    state = client.export_local_state()
    other = tabular_client(TunableLambda(tunable_of(client).settings))
    other.import_local_state(state, seed=3)
    assert tunable_of(other).velocity.item() == tunable_of(client).velocity.item()
    assert tunable_of(other).lam.item() == tunable_of(client).lam.item() and tunable_of(other).rounds == 1
    other.load_state_dict(client.state_dict())
    other.begin_client(0, 2)
    other.start_local_training(lambda epoch: loader)
    d_train = dataset_parity_gap(other, loader)
    assert d_train > 0
    assert tunable_of(other).lam.item() == pytest.approx(starting_lambda(d_train, 0.05))
    assert tunable_of(other).alpha == pytest.approx(0.81)


def test_fixed_mode_has_no_tunable_state_and_keeps_the_whole_epsilon_for_dp_sgd():
    data = toy_data(batch_size=32)
    cfg = compose_config("algorithm=puffle", "dataset=adult", "logger=none")
    client = build_client(cfg, data)
    assert tunable_of(client) is None and client.plugin_of(ClientDP).settings.epsilon_split is None
    assert "parity.lambda" not in client.export_local_state()
    settings = DPSettings(target_epsilon=1.0, target_delta=1e-6, accountant="rdp", rounds=2, local_epochs=1)
    q = 0.05
    assert noise_multiplier_for(settings, q) == get_noise_multiplier(
        target_epsilon=1.0, target_delta=1e-6, sample_rate=q, steps=2 * 20, accountant="rdp")
    assert lambda_noise_for(settings, q) is None


def test_tunable_preset_attaches_the_lambda_from_the_config():
    cfg = compose_config("algorithm=puffle", "dataset=adult", "logger=none", "algorithm.lambda_mode=tunable", SPLIT,
                         "algorithm.parity_target=0.07")
    client = build_client(cfg, toy_data(batch_size=32))
    assert tunable_of(client).settings == LambdaSettings(target=0.07, momentum=0.5, alpha=1.0, alpha_decay=0.95)
    assert client.plugin_of(ClientDP).settings.epsilon_split == [0.8, 0.1, 0.1]


def test_epsilon_split_matches_opacus_accountants_run_independently():
    """epsilon 2 = 1.6 (DP-SGD) + 0.2 (stat, no release here) + 0.2 (lambda), each at delta / 3, RDP accountant."""
    settings = DPSettings(target_epsilon=2.0, target_delta=3e-6, accountant="rdp", epsilon_split=[0.8, 0.1, 0.1],
                          rounds=3, local_epochs=1)
    q, steps = 0.1, 3 * 10
    z = noise_multiplier_for(settings, q)
    z_lambda = lambda_noise_for(settings, q)
    assert z == get_noise_multiplier(target_epsilon=1.6, target_delta=1e-6, sample_rate=q, steps=steps,
                                     accountant="rdp")
    assert z_lambda == get_noise_multiplier(target_epsilon=0.2, target_delta=1e-6, sample_rate=q, steps=steps,
                                            accountant="rdp")
    assert z_lambda > z  # a smaller share, more noise

    dp = ClientDP(settings, torch.nn.Linear(3, 2))
    dp.q, dp.sigma, dp.lambda_sigma = q, z, z_lambda
    for _ in range(steps):
        dp._account(type("Opt", (), {"noise_multiplier": z})())
        dp.account_lambda()
    independent = {}
    for name, sigma in (("sgd", z), ("lambda", z_lambda)):
        acc = RDPAccountant()
        for _ in range(steps):
            acc.step(noise_multiplier=sigma, sample_rate=q)
        independent[name] = acc.get_epsilon(delta=1e-6)
    parts = dp.part_epsilons()
    assert parts["sgd"] == pytest.approx(independent["sgd"], rel=1e-9) and parts["sgd"] <= 1.6 + 1e-6
    assert parts["lambda"] == pytest.approx(independent["lambda"], rel=1e-9) and parts["lambda"] <= 0.2 + 1e-6
    assert parts["stat"] == 0.0
    assert dp.epsilon() == pytest.approx(independent["sgd"] + independent["lambda"], rel=1e-9)

    # the parts survive the client state (resume and other processes continue the accounting)
    again = ClientDP(settings, torch.nn.Linear(3, 2))
    again.import_state(dp.export_state())
    assert again.part_epsilons() == parts


@pytest.mark.parametrize("overrides, match", [
    (["algorithm.lambda_mode=tunable"], r"algorithm\.dp\.epsilon_split"),
    (["algorithm.lambda_mode=tunable", "algorithm.dp.epsilon_split=[0.9,0.1,0.0]"], r"algorithm\.dp\.epsilon_split"),
    (["algorithm.dp.epsilon_split=[0.5,0.1,0.1]"], r"algorithm\.dp\.epsilon_split"),
    (["algorithm.dp.epsilon_split=[0.8,0.2]"], r"algorithm\.dp\.epsilon_split"),
])
def test_bad_budget_settings_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(compose_config("algorithm=puffle", "logger=none", *overrides))


def test_tunable_mode_without_dp_needs_no_budget():
    cfg = load_config(compose_config("algorithm=puffle", "logger=none", "algorithm.lambda_mode=tunable",
                                     "algorithm.dp.enabled=false"))
    assert cfg.algorithm.lambda_mode == "tunable" and cfg.algorithm.parity_target == 0.1
