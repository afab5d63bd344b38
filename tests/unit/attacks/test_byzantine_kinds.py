"""The Byzantine attack family: ALIE / IPM vectors vs their formulas, min-max / min-sum constraints vs a scipy root,
schedules, the round transform (omniscient rows, mimic reports) and per_round sign flip == the original attack."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from resfl_lightning.attacks import byzantine_vectors as V
from resfl_lightning.attacks.byzantine import choose_attackers, fixed_attackers, scheduled_attackers
from resfl_lightning.attacks.byzantine_round import ByzantineAttackSettings, ByzantineRound, LabelFlippedData
from resfl_lightning.attacks.robustness import ByzantineUpdate
from resfl_lightning.attacks.settings import ByzantineSettings
from resfl_lightning.config import ConfigError
from resfl_lightning.types import ClientReport

HONEST = torch.tensor([[1.0, 2.0, 0.0], [3.0, 2.0, 1.0], [2.0, 5.0, -1.0], [2.0, 3.0, 0.0]], dtype=torch.float64)


def report(cid: int, u: float) -> ClientReport:
    return ClientReport(client_id=cid, num_samples=10, ufm_raw=u, ufm_ema=u, u=u, gated=False, val_utility=0.8,
                        val_utility50=0.8, eval_loss=1.0)


def test_alie_matches_its_formula_by_hand():
    # n = 6 updates, f = 2: s = floor(6/2 + 1) - 2 = 2; paper z = Phi^-1((6 - 2)/6), honest form Phi^-1((4 - 2)/4)
    assert V.alie_z(6, 2, "paper") == pytest.approx(stats.norm.ppf(4 / 6))
    assert V.alie_z(6, 2, "honest") == pytest.approx(stats.norm.ppf(2 / 4)) == pytest.approx(0.0, abs=1e-12)
    mu = np.array([2.0, 3.0, 0.0])
    sigma = np.array([np.std([1, 3, 2, 2], ddof=1), np.std([2, 2, 5, 3], ddof=1), np.std([0, 1, -1, 0], ddof=1)])
    np.testing.assert_allclose(V.alie(HONEST, f=2).numpy(), mu - stats.norm.ppf(4 / 6) * sigma)
    with pytest.raises(ValueError, match="not in \\(0, 1\\)"):
        V.alie_z(2, 0, "paper")  # s = floor(2/2 + 1) - 0 = 2 = n: (n - s)/n = 0
    assert V.alie_z(10, 4, "paper") == pytest.approx(stats.norm.ppf(0.8))


def test_ipm_is_minus_epsilon_mean_and_gaussian_has_the_median_norm_scale():
    np.testing.assert_allclose(V.ipm(HONEST, 0.1).numpy(), -0.1 * np.array([2.0, 3.0, 0.0]))
    honest = torch.randn(5, 40000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    g = V.gaussian(honest, None, torch.Generator().manual_seed(1))
    expected = np.median(np.linalg.norm(honest.numpy(), axis=1)) / math.sqrt(40000)
    assert float(g.std()) == pytest.approx(expected, rel=0.02)
    assert float(V.gaussian(honest, 0.5, torch.Generator().manual_seed(1)).std()) == pytest.approx(0.5, rel=0.02)


@pytest.mark.parametrize("attack,holds", [(V.min_max, V.min_max_holds), (V.min_sum, V.min_sum_holds)])
@pytest.mark.parametrize("kind", ["unit", "sign", "std"])
def test_min_max_min_sum_satisfy_their_constraint_at_the_largest_gamma(attack, holds, kind):
    gen = torch.Generator().manual_seed(2)
    honest = torch.randn(6, 8, generator=gen, dtype=torch.float64) + 1.0
    x = attack(honest, kind)
    assert holds(x, honest)
    mu, p = honest.mean(dim=0), V.perturbation(honest, kind)
    gamma = float((mu - x) @ p / (p @ p))
    torch.testing.assert_close(x, mu - gamma * p)

    def slack(g: float) -> float:  # > 0 where the constraint is violated; convex in g, so one root for g > 0
        y = mu - g * p
        h = ((honest - y) ** 2).sum(dim=1)
        pair = ((honest[:, None] - honest[None]) ** 2).sum(dim=2)
        return float(h.max() - pair.max()) if attack is V.min_max else float(h.sum() - pair.sum(dim=1).min())

    root = optimize.brentq(slack, 0.0, 19.9) if slack(19.9) > 0 else 20.0
    assert gamma == pytest.approx(min(root, 20.0), abs=1e-4)


def test_gamma_search_follows_the_ndss_procedure():
    assert V.gamma_search(lambda g: g <= 3.0) == pytest.approx(3.0, abs=1e-5)
    assert V.gamma_search(lambda g: False) == 0.0
    assert V.gamma_search(lambda g: True) == pytest.approx(20.0, abs=1e-4)  # at most 2 x gamma_init


def test_fixed_schedule_keeps_the_same_clients_and_per_round_is_the_old_draw():
    fixed = [scheduled_attackers("fixed", 10, 0.3, 4, r) for r in range(50)]
    assert all(a == fixed[0] for a in fixed) and len(fixed[0]) == 3 and fixed[0] == fixed_attackers(10, 0.3, 4)
    assert fixed_attackers(10, 0.3, 5) != fixed[0] or fixed_attackers(10, 0.3, 6) != fixed[0]
    for r in range(20):
        assert scheduled_attackers("per_round", 10, 0.3, 4, r) == choose_attackers(10, 0.3, 4, r)
    assert len({tuple(scheduled_attackers("per_round", 10, 0.3, 4, r)) for r in range(20)}) > 1


def test_per_round_sign_flip_equals_the_original_transform_bit_for_bit():
    mask = torch.tensor([True, True, False, True, True])
    old = ByzantineUpdate(6, ByzantineSettings(fraction=0.5, gamma=2.5, l2_bound=3.0), seed=7, mask=mask)
    new = ByzantineRound(6, ByzantineAttackSettings(fraction=0.5, gamma=2.5, l2_bound=3.0, schedule="per_round"),
                         seed=7, mask=mask)
    gen = torch.Generator().manual_seed(0)
    for r in range(5):
        assert new.attackers(r) == old.attackers(r)
        for cid in range(6):
            d = torch.randn(5, generator=gen)
            assert torch.equal(new(cid, r, d), old(cid, r, d))
    assert not new.needs_round


def test_scaling_boosts_only_attackers_parameters():
    mask = torch.tensor([True, False, True])
    t = ByzantineRound(4, ByzantineAttackSettings(kind="scaling", gamma=10.0, fraction=0.5), seed=0, mask=mask)
    d = torch.tensor([1.0, 2.0, -1.0])
    for cid in range(4):
        expected = torch.tensor([10.0, 2.0, -10.0]) if cid in t.attackers(0) else d
        torch.testing.assert_close(t(cid, 0, d), expected)


def test_round_transform_sends_the_omniscient_vector_and_mimics_the_honest_median():
    settings = ByzantineAttackSettings(kind="ipm", ipm_epsilon=0.5, fraction=0.4, report="mimic")
    mask = torch.tensor([True, True, False])
    t = ByzantineRound(5, settings, seed=1, mask=mask)
    attackers = t.attackers(0)
    assert t.needs_round and len(attackers) == 2
    deltas = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    reps = [report(i, u=0.1 * (i + 1)) for i in range(5)]
    new_reps, out = t.round_transform(0, reps, deltas)
    honest = [i for i in range(5) if i not in attackers]
    sent = -0.5 * deltas[honest].double().mean(dim=0)
    for i in range(5):
        if i in attackers:
            torch.testing.assert_close(out[i, :2], sent[:2].float())
            assert out[i, 2] == deltas[i, 2]  # BatchNorm statistics stay the attacker's own
            assert new_reps[i].u == pytest.approx(float(np.median([0.1 * (j + 1) for j in honest])))
        else:
            assert torch.equal(out[i], deltas[i]) and new_reps[i] is reps[i]
    assert float(deltas[attackers[0], 0]) == attackers[0] * 3  # the input stack is not modified


def test_settings_reject_a_sent_report_for_omniscient_kinds_and_unknown_keys():
    with pytest.raises(ConfigError, match="report=sent"):
        ByzantineAttackSettings(kind="alie", report="sent")
    with pytest.raises(ConfigError, match="kind"):
        ByzantineAttackSettings(kind="bogus")
    with pytest.raises(ConfigError, match="schedule"):
        ByzantineAttackSettings(schedule="sometimes")
    assert ByzantineAttackSettings().schedule == "fixed"


def test_label_flip_gives_attackers_flipped_labels():
    from resfl_lightning.data.partition import make_federated_splits
    from resfl_lightning.data.tabular import FederatedTabularData

    rng = np.random.default_rng(0)
    n = 400
    groups = rng.integers(0, 2, n)
    splits = make_federated_splits(groups, num_clients=4, seed=0, reserve_fraction=0.05, val_fraction=0.1,
                                   test_fraction=0.2)
    data = FederatedTabularData(torch.randn(n, 3), torch.as_tensor(rng.integers(0, 2, n)), torch.as_tensor(groups),
                                splits, num_groups=2, batch_size=1000, eval_batch_size=1000)
    t = ByzantineRound(4, ByzantineAttackSettings(kind="label_flip", fraction=0.5), seed=0)
    flipped = LabelFlippedData(data, t)
    for cid in range(4):
        y = next(iter(flipped.train_loader(cid, seed=0)))["y"]
        y0 = next(iter(data.train_loader(cid, seed=0)))["y"]
        assert torch.equal(y, 1 - y0) if cid in t.attackers(0) else torch.equal(y, y0)
