"""Adaptive attacks on resfl_robust (issue 57 item 2): each attack on hand cases, the properties it exists for
(the cap reached where a sign flip gets less, a positive cosine with the estimate and a negative inner product with
the honest mean, a report the checked mode keeps, one drift direction every round), and the cap promise under every
adaptive kind (hypothesis over updates, root updates and server u)."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hypothesis import given, settings
from hypothesis import strategies as st

from resfl_lightning.aggregation.fedavg import FedAvg
from resfl_lightning.aggregation.resfl_robust import RobustResfl
from resfl_lightning.analysis.run_settings import ADDED_KEYS
from resfl_lightning.attacks import byzantine_adaptive as A
from resfl_lightning.attacks.byzantine_round import ByzantineAttackSettings, ByzantineRound
from resfl_lightning.attacks.registry import read_attacks
from resfl_lightning.attacks.robustness_attacks import ByzantineAttack
from resfl_lightning.config import ConfigError
from resfl_lightning.train import CONF_DIR
from resfl_lightning.types import ClientReport

KINDS = ("adaptive_cap", "adaptive_trust", "adaptive_report", "adaptive_drift")


def report(cid: int, u: float = 0.0, se: float = math.nan) -> ClientReport:
    return ClientReport(client_id=cid, num_samples=10, ufm_raw=u, ufm_ema=u, u=u, gated=False, val_utility=0.8,
                        val_utility50=0.8, eval_loss=1.0, ufm_se=se)


class Root:
    """The server's root split: the root update g0 and, per evaluation (one per row, in order), server u and SE."""

    def __init__(self, g0: torch.Tensor, u: list[float], se: float = 0.01):
        self.g0, self.u, self.se, self.calls = g0, u, se, 0

    def update(self) -> torch.Tensor:
        return self.g0

    def evaluate(self, delta):
        u = self.u[self.calls % len(self.u)]
        self.calls += 1
        return SimpleNamespace(ufm_raw=u, utility=0.8, ufm_se=self.se)


def robust(g0: torch.Tensor, u: list[float], **kw) -> RobustResfl:
    rule = RobustResfl(**kw)
    rule.root = Root(g0, u)
    return rule


def with_attackers(t: ByzantineRound, honest: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """The round's stack: the attackers' rows (t.attackers(0)) hold `own`, the others `honest`, in client order."""
    attackers = t.attackers(0)
    n = honest.shape[0] + own.shape[0]
    rows, h, a = [], iter(honest), iter(own)
    for cid in range(n):
        rows.append(next(a) if cid in attackers else next(h))
    return torch.stack(rows)


def cosine(x: torch.Tensor, y: torch.Tensor) -> float:
    return float(x.double() @ y.double() / (x.double().norm() * y.double().norm()))


# --- the vectors by hand ----------------------------------------------------------------------------------------------
def test_steer_puts_the_cosine_on_the_estimate_and_the_rest_off_it_towards_p():
    a, p = torch.tensor([2.0, 0.0, 0.0]), torch.tensor([-1.0, 1.0, 0.0])
    torch.testing.assert_close(A.steer(a, p, 0.6, 5.0), torch.tensor([3.0, 4.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(A.steer(a, -a, 0.6, 5.0), torch.tensor([5.0, 0.0, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"cosine must lie in \(0, 1\]"):
        A.steer(a, p, 0.0, 1.0)
    with pytest.raises(ValueError, match="no direction"):
        A.steer(torch.zeros(3), p, 0.5, 1.0)


def test_trust_aware_by_hand():
    """ghat = (1, 0), mu = (1, 1), median honest norm 2: v = 2 (0.1, -sqrt 0.99), cosine 0.1 with ghat and
    <v, mu> = 2 (0.1 - sqrt 0.99) < 0. With ghat = (-1, 0.2) the reverse of mu keeps the margin: v = -2 mu/|mu|."""
    own = torch.tensor([[1.0, 0.5], [1.0, -0.5]])
    honest = torch.tensor([[1.0, 1.0], [0.0, 2.0], [2.0, 0.0]])
    found = A.trust_aware(own, honest, 0.1)
    expected = 2 * torch.tensor([0.1, -math.sqrt(0.99)], dtype=torch.float64)
    torch.testing.assert_close(found.sent, expected)
    assert found.cosine == 0.1 and cosine(found.sent, own.mean(dim=0)) == pytest.approx(0.1)
    assert float(found.sent.double() @ honest.double().mean(dim=0)) < 0
    free = A.trust_aware(torch.tensor([[-1.0, 0.2]]), honest, 0.1)
    torch.testing.assert_close(free.sent, -math.sqrt(2) * torch.ones(2, dtype=torch.float64))
    assert free.cosine == pytest.approx(cosine(free.sent, torch.tensor([-1.0, 0.2])))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), margin=st.floats(0.02, 0.9), dim=st.integers(2, 6))
def test_trust_aware_is_the_most_harmful_vector_the_margin_allows(seed, margin, dim):
    """Against random vectors of the same norm with cosine >= margin to the estimate, none pushes against the honest
    mean harder; the inner product is negative whenever the estimate is more than arcsin(margin) off the mean."""
    gen = torch.Generator().manual_seed(seed)
    own = torch.randn(2, dim, generator=gen, dtype=torch.float64) + 0.3
    honest = torch.randn(5, dim, generator=gen, dtype=torch.float64) + 0.3
    ghat, mu = own.mean(dim=0), honest.mean(dim=0)
    found = A.trust_aware(own, honest, margin)
    norm = A.median_norm(honest)
    assert cosine(found.sent, ghat) >= margin - 1e-9 and float(found.sent.norm()) == pytest.approx(norm)
    for _ in range(20):
        c = margin + (1 - margin) * float(torch.rand(1, generator=gen))
        rival = A.steer(ghat, torch.randn(dim, generator=gen, dtype=torch.float64), c, norm)
        assert float(rival @ mu) >= float(found.sent @ mu) - 1e-9
    if math.acos(max(-1.0, min(1.0, cosine(ghat, mu)))) > math.asin(margin) + 1e-6:
        assert float(found.sent @ mu) < 0


# --- adaptive_cap ----------------------------------------------------------------------------------------------------
def cap_round(kind: str, seed: int = 0):
    """Ten clients, two attackers; the root update is along the attackers' own mean (their estimate is right) and
    the server rates every update alike: resfl_robust with its defaults (cap 1/7)."""
    gen = torch.Generator().manual_seed(seed)
    e1 = torch.tensor([1.0, 0.0, 0.0, 0.0])
    honest = e1 + 0.8 * torch.randn(8, 4, generator=gen)
    own = e1 + 0.1 * torch.randn(2, 4, generator=gen)
    rule = robust(own.double().mean(dim=0), [0.2] * 10)
    t = ByzantineRound(10, ByzantineAttackSettings(kind=kind, fraction=0.2), seed=seed, rule=rule)
    reps = [report(i) for i in range(10)]
    _, sent = t.round_transform(0, reps, with_attackers(t, honest, own))
    if kind == "sign_flip":
        sent = torch.stack([t(cid, 0, row) for cid, row in enumerate(with_attackers(t, honest, own))])
    rule.aggregate(sent, reps)
    w = rule.weights(reps)
    return t, sent, [w[c] for c in t.attackers(0)], rule.cap(10)


def test_adaptive_cap_attackers_each_sit_at_the_cap_where_a_sign_flip_gets_less():
    t, sent, shares, cap = cap_round("adaptive_cap")
    assert cap == pytest.approx(1 / 7) and shares == pytest.approx([cap, cap], abs=1e-9)
    _, _, flipped, _ = cap_round("sign_flip")
    assert sum(flipped) < 2 * cap - 0.05
    # the least alignment that buys the cap (plus the slack): below the threshold the estimate gives less
    round_idx, c = t.adaptive
    assert round_idx == 0 and c < 1 and cosine(sent[t.attackers(0)[0]], t.rule.root.g0) == pytest.approx(c)


def test_cap_cosine_is_the_smallest_that_reaches_the_target():
    share = lambda c: min(0.3, 0.5 * c)  # noqa: E731 - reaches 0.3 at c = 0.6
    assert A.cap_cosine(share, 0.3, evals=30) == pytest.approx(0.6, abs=1e-8)
    assert A.cap_cosine(lambda c: 0.1 * c, 0.3, evals=30) == 1.0  # out of reach: the most weight there is
    # the capped simplex: two attackers beside three honest clients of trust 0.5, equal softmax, cap 1/4
    soft = np.full(5, 0.2)
    assert A.attackers_share(1.0, np.full(3, 0.5), soft, 2, 0.25) == pytest.approx(0.5)
    assert A.attackers_share(0.0, np.full(3, 0.5), soft, 2, 0.25) == 0.0


# --- adaptive_trust in the round --------------------------------------------------------------------------------------
def test_adaptive_trust_keeps_a_positive_cosine_with_its_estimate_and_pushes_against_the_honest_mean():
    gen = torch.Generator().manual_seed(1)
    honest = torch.tensor([1.0, 1.0, 0.0]) + 0.3 * torch.randn(6, 3, generator=gen)
    own = torch.tensor([1.0, 0.0, 0.5]) + 0.1 * torch.randn(2, 3, generator=gen)
    t = ByzantineRound(8, ByzantineAttackSettings(kind="adaptive_trust", fraction=0.25, trust_margin=0.2), seed=4)
    stack = with_attackers(t, honest, own)
    _, out = t.round_transform(0, [report(i) for i in range(8)], stack)
    for cid in t.attackers(0):
        assert cosine(out[cid], own.mean(dim=0)) == pytest.approx(0.2, abs=1e-6)
        assert float(out[cid].double() @ honest.double().mean(dim=0)) < 0
    honest_rows = [c for c in range(8) if c not in t.attackers(0)]
    assert torch.equal(out[honest_rows], stack[honest_rows]) and t.adaptive == (0, 0.2)


# --- adaptive_report --------------------------------------------------------------------------------------------------
def test_within_se_report_by_hand():
    assert A.within_se_report(1.0, 0.1, k=3.0, margin=0.5, floor=0.0) == pytest.approx(0.75)
    assert A.within_se_report(0.1, 0.1, k=3.0, margin=0.5, floor=0.0) == 0.0  # not under ufm.clip_low
    assert A.within_se_report(1.0, math.nan, k=3.0, margin=0.5, floor=0.0) == 1.0
    with pytest.raises(ValueError, match="report margin"):
        A.within_se_report(1.0, 0.1, k=3.0, margin=3.0, floor=0.0)


def test_adaptive_report_passes_the_checked_mode_check_and_takes_the_largest_softmax_weight_where_a_lie_is_dropped():
    """Server u 1.0 for every update (SE 0.01); the honest clients report 1.0, the attacker u_hat - 2.5 SE_client:
    kept, and the largest weight (the cap, 1/3); a lie (u = 0, 10 SE off) is dropped."""
    g0 = torch.tensor([1.0, 0.0])
    x = torch.tensor([[1.0, 0.1], [1.0, -0.1], [1.0, 0.2], [1.0, 0.0]])
    for u, kept in ((A.within_se_report(1.0, 0.1, 3.0, 0.5, 0.0), 1.0), (0.0, 0.0)):  # adaptive, then lie
        rule = robust(g0, [1.0] * 4, mode="checked", f=1)  # cap 1/3
        reps = [report(0, u, se=0.1)] + [report(i, 1.0, se=0.1) for i in (1, 2, 3)]
        rule.aggregate(x, reps)
        assert rule.details["kept"] == [kept, 1.0, 1.0, 1.0]
        w = rule.weights(reps)
        assert (w[0] > max(w[1], w[2], w[3])) == bool(kept)


def test_adaptive_report_hook_reports_within_the_check_of_what_it_sends():
    rule = RobustResfl(mode="checked")
    t = ByzantineRound(4, ByzantineAttackSettings(kind="adaptive_report", fraction=0.25), seed=0, rule=rule)
    (attacker,) = t.attackers(0)
    sent_eval = SimpleNamespace(ufm_raw=1.0, utility=0.8, ufm_se=0.1)
    honest_eval = SimpleNamespace(ufm_raw=0.4, utility=0.8, ufm_se=0.1)
    report_u = lambda raw, util: (raw, raw, False)  # noqa: E731 - the client's EMA / clip / gate, as identity
    result, (ema, u, gated) = t.report(attacker, 0, honest_eval, lambda: sent_eval, report_u)
    assert result is sent_eval and (ema, gated) == (1.0, False) and u == pytest.approx(1.0 - 2.5 * 0.1)
    other = next(c for c in range(4) if c != attacker)
    assert t.report(other, 0, honest_eval, lambda: sent_eval, report_u) == (honest_eval, (0.4, 0.4, False))
    delta = torch.tensor([1.0, -2.0])
    torch.testing.assert_close(t(attacker, 0, delta), -delta)  # the update it sends: the sign flip
    assert torch.equal(t(other, 0, delta), delta) and not t.needs_round


# --- adaptive_drift ---------------------------------------------------------------------------------------------------
def test_adaptive_drift_steps_along_one_fixed_direction_every_round():
    t = ByzantineRound(6, ByzantineAttackSettings(kind="adaptive_drift", fraction=0.34, trust_margin=0.3), seed=7)
    gen = torch.Generator().manual_seed(2)
    directions = []
    for round_idx in range(3):
        honest = torch.randn(4, 5, generator=gen) + 1.0
        own = torch.randn(2, 5, generator=gen) + 1.0
        _, out = t.round_transform(round_idx, [report(i) for i in range(6)], with_attackers(t, honest, own))
        directions.append(t._drift.clone())
        ghat = own.double().mean(dim=0)
        sent = out[t.attackers(0)[0]].double()
        expected = A.steer(ghat, directions[-1], 0.3, A.median_norm(honest))
        torch.testing.assert_close(sent, expected.float().double())
        assert cosine(sent, ghat) == pytest.approx(0.3, abs=1e-6)
        off = directions[-1] - (directions[-1] @ ghat) * ghat / (ghat @ ghat)  # the drift off the estimate
        assert cosine(sent - (sent @ ghat) * ghat / (ghat @ ghat), off) == pytest.approx(1.0, abs=1e-6)
    assert all(torch.equal(d, directions[0]) for d in directions)
    torch.testing.assert_close(A.drift_direction(5, 7), directions[0])
    assert not torch.equal(A.drift_direction(5, 8), directions[0]) and float(directions[0].norm()) == pytest.approx(1)


def test_attackers_whose_own_updates_average_to_zero_send_them_and_say_so():
    t = ByzantineRound(4, ByzantineAttackSettings(kind="adaptive_trust", fraction=0.25), seed=0)
    stack = with_attackers(t, torch.ones(3, 2), torch.zeros(1, 2))
    with pytest.warns(RuntimeWarning, match="no estimate of the root update"):
        _, out = t.round_transform(0, [report(i) for i in range(4)], stack)
    assert torch.equal(out, stack) and t.adaptive is None


# --- the cap promise under every adaptive kind ----------------------------------------------------------------------
@settings(max_examples=120, deadline=None)
@given(n=st.integers(4, 12), kind=st.sampled_from(KINDS), mode=st.sampled_from(["server", "checked"]),
       seed=st.integers(0, 10_000), data=st.data())
def test_resfl_robust_attackers_hold_at_most_f_cap_under_every_adaptive_kind(n, kind, mode, seed, data):
    """Random updates, root update and server u (so random trust patterns, zeros included, and random softmax
    scores): whatever an adaptive kind sends or reports, resfl_robust's f attackers hold at most f cap, f/(n - f) when
    the server is told f (cap = 1/(n - assumed f) otherwise, the assumed f >= f)."""
    f = data.draw(st.integers(1, max(1, math.floor(0.3 * n))), label="attackers")
    known = data.draw(st.booleans(), label="the server knows f")
    rule = RobustResfl(mode=mode, f=f if known else None)  # else it assumes floor(0.3 n) >= f
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=gen)
    g0 = torch.randn(4, generator=gen, dtype=torch.float64)
    server_u = data.draw(st.lists(st.floats(0.0, 5.0), min_size=n, max_size=n), label="server u")
    rule.root = Root(g0, server_u)
    t = ByzantineRound(n, ByzantineAttackSettings(kind=kind, fraction=f / n), seed=seed, rule=rule)
    attackers = t.attackers(0)
    assert len(attackers) == f
    reps = [report(i, float(torch.rand(1, generator=gen)) * 5, se=0.05) for i in range(n)]
    if kind == "adaptive_report":
        x = torch.stack([t(cid, 0, row) for cid, row in enumerate(x)])
        reps = [report(c, A.within_se_report(server_u[c], 0.05, rule.check_k, 0.5, 0.0), se=0.05)
                if c in attackers else r for c, r in enumerate(reps)]
    else:
        reps, x = t.round_transform(0, reps, x)
    with warnings.catch_warnings():  # the rule's own "no positive weight" warning: the promise holds either way
        warnings.simplefilter("ignore")
        rule.aggregate(x, reps)
    w = rule.weights(reps)
    cap = rule.cap(n)
    assert sum(w[c] for c in attackers) <= f * cap + 1e-9
    if known:
        assert f * cap == pytest.approx(f / (n - f))


# --- configuration ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_each_adaptive_kind_has_its_preset_with_the_margins_at_their_legacy_values(kind):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"attack=byzantine_{kind}"])
    _, attacks = read_attacks(cfg.attack)
    s = attacks[0].settings
    assert s.kind == kind and s.report == "honest"
    assert (s.trust_margin, s.report_margin) == (ADDED_KEYS["attack.byzantine.trust_margin"],
                                                 ADDED_KEYS["attack.byzantine.report_margin"])


def test_bad_adaptive_settings_name_their_key():
    for key, bad in (("trust_margin", 0.0), ("trust_margin", 1.5), ("report_margin", -1.0)):
        with pytest.raises(ConfigError, match=rf"attack\.byzantine\.{key}: must"):
            ByzantineAttackSettings(kind="adaptive_trust", **{key: bad})
    with pytest.raises(ConfigError, match=r"attack\.byzantine\.report=lie: kind=adaptive_report"):
        ByzantineAttackSettings(kind="adaptive_report", report="lie")
    with pytest.raises(ConfigError, match="report=sent"):
        ByzantineAttackSettings(kind="adaptive_cap", report="sent")
    with pytest.raises(ConfigError, match=r"kind=adaptive_cap attacks resfl_robust's cap, beta: .*FedAvg"):
        ByzantineRound(10, ByzantineAttackSettings(kind="adaptive_cap"), seed=0, rule=FedAvg())
    with pytest.raises(ConfigError, match=r"attack\.byzantine\.report_margin=3\.0: must be below"):
        ByzantineRound(10, ByzantineAttackSettings(kind="adaptive_report", report_margin=3.0), seed=0,
                       rule=RobustResfl())
    ByzantineRound(10, ByzantineAttackSettings(kind="adaptive_trust"), seed=0, rule=FedAvg())  # reads no rule


def test_the_round_logs_the_cosine_an_adaptive_kind_aimed_at():
    t, _, _, _ = cap_round("adaptive_cap")
    attack = ByzantineAttack(t.settings, seed=0)
    attack.transform = t
    metrics = {}
    attack.on_round_end(SimpleNamespace(data=SimpleNamespace(num_clients=10)), 0, t.rule.weights(
        [report(i) for i in range(10)]), metrics)
    assert metrics["attack/byzantine_strength"] == t.adaptive[1]
    assert metrics["attack/byzantine_weight_share"] == pytest.approx(2 / 7)
    assert "attack/byzantine_deviation" not in metrics
