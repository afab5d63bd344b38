"""Calibrated Byzantine attacks: strengths relative to n and f, the line search, optimal ALIE / IPM and the
rule-tailored min-max / min-sum against hand-computed cases on small stacks (n = 5, f = 1), and the round transform
that searches on the configured rule's preview."""

from __future__ import annotations

import math
from statistics import NormalDist
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from resfl_lightning.aggregation.fedavg import FedAvg
from resfl_lightning.aggregation.krum import Krum
from resfl_lightning.aggregation.median import CoordinateMedian
from resfl_lightning.aggregation.trimmed_mean import TrimmedMean
from resfl_lightning.attacks import byzantine_calibrated as C
from resfl_lightning.attacks import byzantine_vectors as V
from resfl_lightning.attacks.byzantine import strength
from resfl_lightning.attacks.byzantine_round import ByzantineAttackSettings, ByzantineRound
from resfl_lightning.attacks.registry import read_attacks
from resfl_lightning.attacks.robustness import ByzantineUpdate
from resfl_lightning.attacks.robustness_attacks import ByzantineAttack
from resfl_lightning.attacks.settings import ByzantineSettings
from resfl_lightning.config import ConfigError
from resfl_lightning.train import CONF_DIR
from resfl_lightning.types import ClientReport

BYZANTINE = "resfl_lightning.attacks.robustness_attacks.ByzantineAttack"
# four honest updates, one coordinate: mu = 2.5; one attacker makes n = 5
LINE = torch.tensor([[1.0], [2.0], [3.0], [4.0]], dtype=torch.float64)
# two coordinates: the first as LINE (sigma = sqrt(5/3)), the second 0, 0, 1, 9 (mu = 2.5, sigma = sqrt(19))
PLANE = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0], [4.0, 9.0]], dtype=torch.float64)


def reports(n: int) -> list[ClientReport]:
    return [ClientReport(client_id=i, num_samples=10, ufm_raw=0.0, ufm_ema=0.0, u=0.0, gated=False, val_utility=0.8,
                         val_utility50=0.8, eval_loss=1.0) for i in range(n)]


def rule_aggregate(rule, honest: torch.Tensor, f: int):
    """aggregate(sent): the rule's preview of the honest rows followed by f copies of `sent`."""
    reps = reports(honest.shape[0] + f)
    return lambda sent: rule.preview(torch.cat([honest, sent[None].expand(f, -1)]), reps)


# --- strengths relative to n and f ----------------------------------------------------------------------------------
def test_relative_strengths_are_n_over_f_and_half_the_reversing_ipm_epsilon():
    assert strength("n_over_f", 10, 2) == 5.0 and strength("h_over_2f", 10, 2) == 2.0
    assert strength(0.1, 10, 2) == 0.1 and strength(100, 10, 2) == 100.0
    with pytest.raises(ValueError, match="0 < f < n"):
        strength("n_over_f", 10, 0)
    with pytest.raises(ValueError, match="n_over_f"):
        strength("n/f", 10, 2)
    # the attack's n = its clients, f = round(fraction n)
    t = ByzantineRound(10, ByzantineAttackSettings(kind="ipm", gamma="n_over_f", ipm_epsilon="h_over_2f",
                                                   fraction=0.1), seed=0)
    assert t.gamma == 10.0 and t.epsilon == 4.5
    assert ByzantineUpdate(10, ByzantineSettings(fraction=0.0, gamma="n_over_f"), seed=0).gamma == 1.0  # unused


def test_strength_keys_accept_their_names_and_reject_anything_else_naming_the_key():
    _, attacks = read_attacks({"byzantine": {"_target_": BYZANTINE, "gamma": "n_over_f", "kind": "optimal_ipm",
                                             "ipm_epsilon": "h_over_2f", "search_evals": 8}})
    s = attacks[0].settings
    assert (s.gamma, s.ipm_epsilon, s.search_evals) == ("n_over_f", "h_over_2f", 8)
    for key, bad in (("gamma", "n/f"), ("gamma", -1.0), ("ipm_epsilon", "half"), ("ipm_epsilon", 0)):
        with pytest.raises(ConfigError, match=rf"attack\.byzantine\.{key}: must be > 0 or one of \['n_over_f'"):
            read_attacks({"byzantine": {"_target_": BYZANTINE, key: bad}})
    with pytest.raises(ConfigError, match=r"attack\.byzantine\.search_evals: must be >= 1"):
        ByzantineAttackSettings(kind="optimal_alie", search_evals=0)
    with pytest.raises(ConfigError, match=r"attack\.byzantine\.gamma=h_over_2f: .*0 < f < n"):
        ByzantineUpdate(4, ByzantineSettings(fraction=1.0, gamma="h_over_2f"), seed=0)
    with pytest.raises(ConfigError, match="report=sent"):
        ByzantineAttackSettings(kind="tailored_min_max", report="sent")


@pytest.mark.parametrize("kind", ["optimal_alie", "optimal_ipm", "tailored_min_max", "tailored_min_sum"])
def test_each_calibrated_kind_has_its_preset_and_the_relative_spellings_compose(kind):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"attack=byzantine_{kind}", "attack.byzantine.gamma=n_over_f",
                                          "attack.byzantine.ipm_epsilon=h_over_2f"])
    _, attacks = read_attacks(cfg.attack)
    s = attacks[0].settings
    assert (s.kind, s.gamma, s.ipm_epsilon, s.search_evals) == (kind, "n_over_f", "h_over_2f", 16)


def test_sign_flip_at_gamma_n_over_f_reverses_the_fedavg_mean_where_gamma_one_does_not():
    n, gen = 10, torch.Generator().manual_seed(0)
    own = torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(n, 3, generator=gen)
    for gamma, sign in (("n_over_f", -1), (1.0, 1)):
        t = ByzantineUpdate(n, ByzantineSettings(fraction=0.2, gamma=gamma), seed=3)
        attackers = t.attackers(0)
        sent = torch.stack([t(cid, 0, own[cid]) for cid in range(n)])
        agg = FedAvg().preview(sent, reports(n))
        honest_mean = own[[c for c in range(n) if c not in attackers]].double().mean(dim=0)
        assert len(attackers) == 2 and sign * float(agg @ honest_mean) > 0


# --- the line search ------------------------------------------------------------------------------------------------
def test_line_maximise_doubles_while_it_improves_then_closes_in():
    assert C.line_maximise(lambda x: -(x - 3.0) ** 2, 0.0) == (3.0, 0.0)  # probes 0, 1, 3, 7, then around 3
    assert C.line_maximise(lambda x: x, 0.5, evals=5) == (15.5, 15.5)  # 0.5 + 1 + 2 + 4 + 8
    assert C.line_maximise(lambda x: 1.0, 2.0) == (2.0, 1.0)  # nothing beats the start
    x, y = C.line_maximise(lambda x: -abs(x - 2.2), 0.0, evals=40)
    assert x == pytest.approx(2.2, abs=0.05) and x >= 0
    with pytest.raises(ValueError, match="evals >= 1"):
        C.line_maximise(lambda x: x, 0.0, evals=0)


# --- optimal ALIE / IPM ---------------------------------------------------------------------------------------------
def test_optimal_alie_against_the_median_by_hand():
    """Median of five with one attacker at mu - z sigma: coordinate 1 moves until the attacker passes 2 (z >= 0.387),
    coordinate 2 from its 1.5 floor until the attacker passes 0 (z >= 0.574); the farthest is (2, 0), sqrt(6.5)
    from mu = (2.5, 2.5). The paper's z = Phi^-1(3/5) stops at (2.5 - z sigma_1, 1)."""
    aggregate = rule_aggregate(CoordinateMedian(), PLANE, f=1)
    found = C.optimal_alie(PLANE, aggregate, start=V.alie_z(5, 1), evals=16)
    assert found.deviation == pytest.approx(math.sqrt(6.5))
    assert found.strength >= 2.5 / math.sqrt(19) and found.sent[0] <= 2.0 and found.sent[1] <= 0.0
    torch.testing.assert_close(aggregate(found.sent), torch.tensor([2.0, 0.0], dtype=torch.float64))
    z = NormalDist().inv_cdf(3 / 5)
    fixed = float((aggregate(V.alie(PLANE, f=1)) - PLANE.mean(dim=0)).norm())
    assert fixed == pytest.approx(math.hypot(z * math.sqrt(5 / 3), 1.5)) and fixed < found.deviation


def test_optimal_ipm_under_fedavg_grows_with_every_evaluation():
    """FedAvg of four honest rows and one -eps mu: mu (4 - eps)/5, deviation |mu| (1 + eps)/5, increasing in eps: the
    search doubles its step at each of its 16 evaluations, eps = 0.1 + 2^15 - 1."""
    mu = PLANE.mean(dim=0)
    found = C.optimal_ipm(PLANE, rule_aggregate(FedAvg(), PLANE, f=1), start=0.1, evals=16)
    assert found.strength == pytest.approx(0.1 + 2**15 - 1)
    assert found.deviation == pytest.approx(float(mu.norm()) * (1 + found.strength) / 5)
    torch.testing.assert_close(found.sent, -found.strength * mu)


@pytest.mark.parametrize("rule", [CoordinateMedian(), TrimmedMean(beta=0.2), Krum(f=1), FedAvg()],
                         ids=["median", "trimmed_mean", "krum", "fedavg"])
def test_the_optimal_attacks_move_the_aggregate_at_least_as_far_as_their_fixed_strength(rule):
    gen = torch.Generator().manual_seed(5)
    honest = torch.randn(4, 6, generator=gen, dtype=torch.float64) + 0.5
    aggregate = rule_aggregate(rule, honest, f=1)
    mu = honest.mean(dim=0)

    def moved(sent: torch.Tensor) -> float:
        return float((aggregate(sent) - mu).norm())

    assert C.optimal_alie(honest, aggregate, V.alie_z(5, 1)).deviation >= moved(V.alie(honest, 1)) - 1e-12
    assert C.optimal_ipm(honest, aggregate, 0.1).deviation >= moved(V.ipm(honest, 0.1)) - 1e-12
    for kind, agnostic in (("tailored_min_max", V.min_max), ("tailored_min_sum", V.min_sum)):
        assert C.tailored(kind, honest, aggregate).deviation >= moved(agnostic(honest)) - 1e-12


# --- min-max / min-sum tailored to the rule -------------------------------------------------------------------------
def test_tailored_min_sum_against_the_trimmed_mean_by_hand():
    """Trimmed mean (beta 0.2: one value off each end) of 1, 2, 3, 4 and x = 2.5 - gamma: (x + 5)/3 while 1 <= x <= 2,
    then mean(1, 2, 3) = 2; at most 0.5 from mu. The rule-agnostic min-sum keeps sum (x - d_i)^2 <= 6, x >= 2: 1/6."""
    aggregate = rule_aggregate(TrimmedMean(beta=0.2), LINE, f=1)
    found = C.tailored("tailored_min_sum", LINE, aggregate)
    assert found.deviation == pytest.approx(0.5) and found.strength >= 1.5
    assert float((aggregate(V.min_sum(LINE)) - 2.5).abs()) == pytest.approx(1 / 6, abs=1e-4)


def test_tailored_min_max_against_krum_by_hand():
    """Krum (f = 1: each score sums the 2 nearest others) of 1, 2, 3, 4 and x = 2.5 - gamma picks x while gamma < 1.5
    (deviation gamma), then the honest 1 up to gamma = 2.5 (1.5), then 2 (0.5): the most is 1.5. The rule-agnostic
    min-max stops at x >= 1 (gamma <= 1.5) from below."""
    aggregate = rule_aggregate(Krum(f=1), LINE, f=1)
    assert [float(aggregate(torch.tensor([2.5 - g], dtype=torch.float64))) for g in (1.0, 2.0, 3.0)] == [1.5, 1.0, 2.0]
    found = C.tailored("tailored_min_max", LINE, aggregate)
    assert found.deviation == pytest.approx(1.5) and 1.5 - 1e-4 <= found.strength <= 2.5
    with pytest.raises(ValueError, match="tailored attack must be one of"):
        C.tailored("min_max", LINE, aggregate)


# --- in the round ---------------------------------------------------------------------------------------------------
def test_round_transform_searches_on_the_rule_and_leaves_it_as_it_was():
    """One attacker of five; the third coordinate is a buffer the attack leaves alone. What the search reports is what
    the rule then aggregates, and its previews leave no logged weights behind."""
    rule = TrimmedMean(beta=0.2)
    mask = torch.tensor([True, True, False])
    t = ByzantineRound(5, ByzantineAttackSettings(kind="tailored_min_sum", fraction=0.2), seed=0, mask=mask,
                       rule=rule)
    (attacker,) = t.attackers(0)
    honest = [i for i in range(5) if i != attacker]
    deltas = torch.tensor([[1.0, 0.0, 7.0], [2.0, 0.0, 7.0], [3.0, 1.0, 7.0], [4.0, 9.0, 7.0], [5.0, 5.0, 7.0]])
    deltas[[*honest, attacker]] = deltas.clone()  # the honest rows are PLANE's, whoever attacks
    reps = reports(5)
    _, out = t.round_transform(0, reps, deltas)
    assert not hasattr(rule, "_effective")  # no preview left its weights
    round_idx, found = t.calibrated
    assert round_idx == 0 and out[attacker, 2] == 7.0 and torch.equal(out[honest], deltas[honest])
    torch.testing.assert_close(out[attacker, :2], found.sent.float())
    moved = rule.aggregate_round(out, reps)[:2] - deltas[honest, :2].double().mean(dim=0)
    assert float(moved.norm()) == pytest.approx(found.deviation)
    metrics = {}
    attack = ByzantineAttack(t.settings, seed=0)
    attack.transform = t
    attack.on_round_end(SimpleNamespace(data=SimpleNamespace(num_clients=5)), 0, rule.weights(reps), metrics)
    assert metrics["attack/byzantine_strength"] == found.strength
    assert metrics["attack/byzantine_deviation"] == found.deviation
    with pytest.raises(RuntimeError, match="needs `rule`"):
        ByzantineRound(5, t.settings, seed=0).round_transform(0, reps, deltas)
