"""PUFFLE's missing-group fallback (clients/parity_rates.py): the gap with an absent group against hand-computed
values, the server's pooled P(k|z) against the rates of all clients' rows computed here, the counts' noise against
the Gaussian mechanism's (epsilon, delta) by opacus' accountants, and the default preset left without it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from resfl_lightning.builders import algorithm_of, build_client
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.parity_rates import (
    COUNTS_REPORT_KEY,
    PARITY_COUNTS_KEY,
    SENSITIVITY,
    GlobalParity,
    PooledCounts,
    global_rates,
    group_table,
    pooled_table,
)
from resfl_lightning.clients.parity_term import ParityTerm, dataset_parity_mass
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.config import ConfigError
from resfl_lightning.federation.checkpoint import ServerState
from resfl_lightning.losses.parity import detection_parity_gap, parity_gap, prediction_mass
from resfl_lightning.privacy import gaussian
from resfl_lightning.privacy.dp import ClientDP, DPSettings, stat_noise_for
from resfl_lightning.run_config.load import load_config
from resfl_lightning.types import ClientReport
from tests.helpers import compose_config
from tests.unit.clients.test_tabular_client import NUM_FEATURES, NUM_GROUPS, toy_data

torch.set_num_threads(1)
SPLIT = "algorithm.dp.epsilon_split=[0.8,0.1,0.1]"
MASS = torch.tensor([[0.8, 0.0], [0.6, 0.0], [0.0, 0.7], [0.9, 0.0]])


def test_an_absent_group_is_compared_through_the_global_rates():
    """Groups 0 and 1 present: means [0.7, 0] and [0.45, 0.35], gap 0.35 both ways. Group 2 absent, global
    P(.|2) = [0.1, 0.9], every row is "not 2" with mean [0.575, 0.175]: max(0.475, 0.725) = 0.725."""
    groups = torch.tensor([0, 0, 1, 1])
    rates = torch.tensor([[0.3, 0.2], [0.5, 0.5], [0.1, 0.9]], dtype=torch.float64)
    assert parity_gap(MASS, groups).item() == pytest.approx(0.35)
    assert parity_gap(MASS, groups, rates).item() == pytest.approx(0.725)
    no_estimate = rates.clone()
    no_estimate[2] = math.nan
    assert parity_gap(MASS, groups, no_estimate).item() == pytest.approx(0.35)  # as before any estimate


def test_the_global_rates_are_a_constant_and_a_whole_batch_group_is_compared_through_them():
    """Every row is group 0, group 1 absent with P(.|1) = [0.2, 0.3]: mean [0.575, 0.175], gap max(0.375, 0.125)."""
    mass = MASS.clone().requires_grad_(True)
    groups = torch.zeros(4, dtype=torch.long)
    rates = torch.tensor([[0.9, 0.9], [0.2, 0.3], [math.nan, math.nan]], dtype=torch.float64, requires_grad=True)
    assert parity_gap(mass, groups).item() == 0.0  # no comparable group without the fallback
    gap = parity_gap(mass, groups, rates)
    assert gap.item() == pytest.approx(0.375)
    gap.backward()
    assert rates.grad is None  # the server's estimate takes no gradient
    expected = torch.zeros_like(MASS)
    expected[:, 0] = 0.25  # d|0.2 - mean_0| / d mass_i0 = +1/4 (the mean is above the global rate)
    torch.testing.assert_close(mass.grad, expected)


def test_rows_of_unknown_group_and_the_detection_gap_use_the_same_fallback():
    scores = torch.tensor([0.9, 0.2, 0.7, 0.6])
    groups = torch.tensor([0, 0, -1, 0])
    rates = torch.tensor([[0.5], [0.1]], dtype=torch.float64)
    # mass [0.9, 0, -, 0.6] at threshold 0.5 over the known rows: mean 0.5; group 1 absent: |0.1 - 0.5|
    assert detection_parity_gap(scores, groups, 0.5, rates).item() == pytest.approx(0.4)
    assert detection_parity_gap(scores, groups, 0.5).item() == 0.0


def test_with_every_group_present_the_fallback_changes_nothing_bitwise():
    torch.manual_seed(0)
    mass = prediction_mass(torch.randn(64, 3))
    groups = torch.arange(64) % 3
    rates = torch.rand(3, 3, dtype=torch.float64)
    assert torch.equal(parity_gap(mass, groups, rates), parity_gap(mass, groups))


def test_one_row_moves_a_table_by_at_most_the_sensitivity():
    mass, groups = MASS, torch.tensor([0, 0, 1, 1])
    for extra_mass, extra_group in (([1.0, 0.0], 2), ([0.0, 0.4], 0)):
        more = group_table(torch.cat([mass, torch.tensor([extra_mass])]),
                           torch.cat([groups, torch.tensor([extra_group])]), 3)
        assert (more - group_table(mass, groups, 3)).norm().item() <= SENSITIVITY + 1e-12


def fallback_client(dp: ClientDP | None = None) -> TabularClient:
    """PUFFLE's fixed-lambda term with the fallback, its counts noised on `dp` (None: exact)."""
    torch.manual_seed(0)
    client = TabularClient(NUM_FEATURES, NUM_GROUPS, LossWeights(lambda_priv=0.0, lambda_fair=0.0),
                           UfmSettings(), OptimSettings(), hidden=(16, 8))
    if dp is not None:
        client.add_plugin(dp)
    client.add_plugin(ParityTerm(0.5, fallback=GlobalParity(NUM_GROUPS), dp=dp))
    return client


def shared_counts(client: TabularClient) -> list[list[float]]:
    """The (noisy) table the client's parity term released this round ([] without one)."""
    return client.plugin_of(ParityTerm).report(client, None).get(COUNTS_REPORT_KEY, [])


def reports_of(client: TabularClient, data, round_idx: int) -> list[ClientReport]:
    """Each client's round start as the orchestrator runs it (the received model, its training split)."""
    out = []
    for cid in range(data.num_clients):
        client.import_local_state(None, seed=100 + cid)
        client.begin_client(cid, round_idx)
        client.receive({})
        client.start_local_training(lambda epoch, cid=cid: data.train_loader(cid, seed=epoch))
        out.append(ClientReport(client_id=cid, num_samples=data.num_train(cid), ufm_raw=0.0, ufm_ema=0.0, u=0.0,
                                gated=False, val_utility=0.0, val_utility50=0.0, eval_loss=0.0,
                                extras=client.report_extras(None)))
    return out


def test_the_servers_sum_of_exact_counts_is_the_pooled_rate_of_all_clients_rows():
    data = toy_data(batch_size=32)
    client = fallback_client()
    state = ServerState(round_idx=-1, theta=torch.zeros(1), int_buffers={})
    state = PooledCounts().end_round(state, reports_of(client, data, 0))
    rates = global_rates(state.extra[PARITY_COUNTS_KEY])

    # independently: every client's training rows through the same model, P(k|z) by plain numpy
    client.eval()
    probs, groups = [], []
    with torch.no_grad():
        for cid in range(data.num_clients):
            for batch in data.train_loader(cid, seed=0):
                probs.append(client.model(batch["x"]).logits.softmax(-1).double().numpy())
                groups.append(batch["groups"].numpy())
    p, g = np.concatenate(probs), np.concatenate(groups)
    pred = p.argmax(1)
    expected = np.array([[p[(g == z) & (pred == k), k].sum() / (g == z).sum() for k in range(p.shape[1])]
                         for z in range(NUM_GROUPS)])
    assert sum(data.num_train(c) for c in range(data.num_clients)) == len(g)
    np.testing.assert_allclose(rates.numpy(), expected, rtol=1e-6, atol=1e-7)

    # next round every client receives it; the step's gap then falls back on it for a group the batch lacks
    client.receive(state.extra)
    torch.testing.assert_close(client.plugin_of(ParityTerm).global_rates, rates)
    batch = next(iter(data.train_loader(0, seed=0)))
    keep = batch["groups"] != 2
    logits = client.model(batch["x"][keep]).logits
    mass = prediction_mass(logits).double()
    hand = max(parity_gap(mass, batch["groups"][keep]).item(), (rates[2] - mass.mean(0)).abs().max().item())
    assert parity_gap(mass, batch["groups"][keep], client.plugin_of(ParityTerm).global_rates).item() == \
        pytest.approx(hand)


def test_a_round_without_counts_keeps_the_last_sum_and_negative_sums_are_clamped():
    state = ServerState(round_idx=0, theta=torch.zeros(1), int_buffers={})
    assert PooledCounts().end_round(state, []) is state
    noisy = [torch.tensor([[3.0, -5.0, 4.0], [-2.0, 1.0, 0.5]]), torch.tensor([[1.0, 2.0, 1.0], [0.5, -0.5, 0.2]])]
    pooled = pooled_table(noisy)
    torch.testing.assert_close(pooled, torch.tensor([[4.0, 0.0, 5.0], [0.0, 0.5, 0.7]]))
    rates = global_rates(pooled)
    torch.testing.assert_close(rates[0], torch.tensor([0.8, 0.0]))
    assert rates[1].isnan().all()  # counted less than once: no fallback for that group


def test_the_counts_noise_is_the_gaussian_mechanism_for_epsilon_stat_over_the_rounds():
    """epsilon 2 x 0.1 at delta 3e-6 / 3 over R = 5 releases of sensitivity sqrt(2): z from the exact curve; opacus'
    PRV accountant (sample rate 1, R steps of z) brackets it and its RDP bound lies above it."""
    settings = DPSettings(target_epsilon=2.0, target_delta=3e-6, accountant="prv", epsilon_split=[0.8, 0.1, 0.1],
                          rounds=5, local_epochs=1)
    z = stat_noise_for(settings)
    prv = PRVAccountant()
    prv.history = [(z, 1.0, 5)]
    upper = prv.get_epsilon(delta=1e-6, eps_error=1e-3)
    assert 0.2 <= upper <= 0.2 + 2e-3
    rdp = RDPAccountant()
    rdp.history = [(z, 1.0, 5)]
    assert rdp.get_epsilon(delta=1e-6) > 0.2
    assert gaussian.gaussian_delta(0.2, math.sqrt(5) / z) == pytest.approx(1e-6, rel=1e-9)

    dp = ClientDP(settings, torch.nn.Linear(3, 2))
    assert dp.stat_sigma == z and dp.part_epsilons()["stat"] == 0.0
    client = fallback_client(dp)
    data = toy_data(batch_size=32)
    draws = []
    for r in range(5):  # the release's noise: std z sqrt(2) around the exact table
        client.import_local_state(client.export_local_state() if r else None, seed=7)
        client.begin_client(0, r)
        client.start_local_training(lambda epoch: data.train_loader(0, seed=epoch))
        noisy = torch.tensor(shared_counts(client))
        draws.append((noisy - group_table(*dataset_parity_mass(client, data.train_loader(0, seed=0)), NUM_GROUPS))
                     / (z * SENSITIVITY))
    assert dp.stat_history == [(z, 5)]
    assert dp.part_epsilons()["stat"] == pytest.approx(0.2, rel=1e-9)
    sample = torch.stack(draws).flatten()
    assert abs(sample.mean().item()) < 0.6 and 0.5 < sample.std().item() < 1.6  # 45 draws of N(0, 1)

    again = ClientDP(settings, torch.nn.Linear(3, 2))  # the releases survive the client state (resume, N ranks)
    again.import_state(dp.export_state())
    assert again.stat_history == [(z, 5)] and again.part_epsilons()["stat"] == dp.part_epsilons()["stat"]


def test_the_default_preset_has_no_fallback_and_reports_no_counts():
    data = toy_data(batch_size=32)
    cfg = compose_config("algorithm=puffle", "dataset=adult", "logger=none")
    client = build_client(cfg, data)
    term = client.plugin_of(ParityTerm)
    assert term.fallback is None and term.global_rates is None
    assert shared_counts(client) == [] and client.plugin_of(ClientDP).stat_sigma is None
    client.receive({PARITY_COUNTS_KEY: torch.ones(NUM_GROUPS, 3)})  # a no-op without the fallback
    assert term.global_rates is None
    assert algorithm_of(load_config(cfg)).server_plugins() == []  # the server pools nothing
    state = ServerState(round_idx=0, theta=torch.zeros(1), int_buffers={}, extra={"x": torch.zeros(1)})
    report = ClientReport(client_id=0, num_samples=1, ufm_raw=0.0, ufm_ema=0.0, u=0.0, gated=False, val_utility=0.0,
                          val_utility50=0.0, eval_loss=0.0)
    assert PooledCounts().end_round(state, [report]) is state


def test_the_split_turns_the_fallback_on_and_without_dp_the_key_does():
    data = toy_data(batch_size=32)
    with_split = build_client(compose_config("algorithm=puffle", "dataset=adult", "logger=none", SPLIT), data)
    assert isinstance(with_split.plugin_of(ParityTerm).fallback, GlobalParity)
    assert with_split.plugin_of(ClientDP).stat_sigma > 0
    no_stat = build_client(compose_config("algorithm=puffle", "dataset=adult", "logger=none",
                                          "algorithm.dp.epsilon_split=[0.9,0.0,0.1]"), data)
    assert no_stat.plugin_of(ParityTerm).fallback is None
    exact = build_client(compose_config("algorithm=puffle", "dataset=adult", "logger=none",
                                        "algorithm.dp.enabled=false", "algorithm.parity_global_fallback=true"), data)
    assert isinstance(exact.plugin_of(ParityTerm).fallback, GlobalParity) and exact.plugin_of(ClientDP) is None
    with pytest.raises(ConfigError, match=r"algorithm\.parity_global_fallback"):
        load_config(compose_config("algorithm=puffle", "logger=none", "algorithm.parity_global_fallback=true"))


def test_exact_counts_without_dp_are_the_table_itself():
    data = toy_data(batch_size=32)
    client = fallback_client()
    client.import_local_state(None, seed=1)
    client.begin_client(0, 0)
    client.start_local_training(lambda epoch: data.train_loader(0, seed=epoch))
    exact = group_table(*dataset_parity_mass(client, data.train_loader(0, seed=0)), NUM_GROUPS)
    assert torch.equal(torch.tensor(shared_counts(client), dtype=torch.float64), exact)
    assert exact[:, -1].sum().item() == data.num_train(0)
