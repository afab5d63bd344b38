"""Bulyan, norm bounding, centered clipping, FLTrust, FLAME and resfl_robust against numpy / hand-computed cases."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import pdist, squareform
from sklearn.cluster import HDBSCAN

from resfl_lightning.aggregation.bulyan import Bulyan, bulyan_selection
from resfl_lightning.aggregation.centered_clipping import PREVIOUS_KEY, CenteredClipping
from resfl_lightning.aggregation.flame import Flame, flame_noise_scale
from resfl_lightning.aggregation.fltrust import FLTrust
from resfl_lightning.aggregation.norm_bounding import NormBounding
from resfl_lightning.aggregation.registry import build_aggregation
from resfl_lightning.aggregation.resfl_robust import RobustResfl, UfmPolicy, capped_weights
from resfl_lightning.aggregation.robust_ops import project_capped_simplex
from resfl_lightning.federation.checkpoint import ServerState
from resfl_lightning.types import ClientReport

CONF = Path(__file__).resolve().parents[3] / "conf" / "aggregation"


def report(cid: int, u: float = 0.0, se: float = math.nan, gated: bool = False) -> ClientReport:
    return ClientReport(client_id=cid, num_samples=10, ufm_raw=u, ufm_ema=u, u=u, gated=gated, val_utility=0.8,
                        val_utility50=0.8, eval_loss=1.0, ufm_se=se)


def reports(n: int) -> list[ClientReport]:
    return [report(i) for i in range(n)]


# --- Bulyan --------------------------------------------------------------------------------------------------------
def numpy_bulyan(x: np.ndarray, f: int) -> np.ndarray:
    """Straight from the paper with python loops: repeated Krum (n' - f - 2 nearest others), then per coordinate the
    mean of the n - 4f selected values closest to their median."""
    remaining, chosen = list(range(len(x))), []
    while len(chosen) < len(x) - 2 * f:
        k = max(1, len(remaining) - f - 2)
        scores = []
        for i in remaining:
            d = sorted(float(np.sum((x[i] - x[j]) ** 2)) for j in remaining if j != i)
            scores.append(sum(d[:k]))
        chosen.append(remaining.pop(int(np.argmin(scores))))
    sel = x[chosen]
    med = np.median(sel, axis=0)
    beta = len(sel) - 2 * f
    return np.array([np.mean(sel[np.argsort(np.abs(sel[:, c] - med[c]), kind="stable")[:beta], c])
                     for c in range(x.shape[1])])


def test_bulyan_matches_numpy_reference_and_drops_the_outlier():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 4))
    x[3] = 100.0  # the Byzantine update
    got = Bulyan(f=1).aggregate(torch.from_numpy(x).float(), reports(7))
    np.testing.assert_allclose(got.numpy(), numpy_bulyan(x.astype(np.float32).astype(np.float64), 1), rtol=1e-6)
    assert 3 not in bulyan_selection(torch.from_numpy(x), 1)


def test_bulyan_hand_case():
    # 7 scalar updates, f = 1: repeated Krum keeps the 5 closest {0, 1, 2, 3, 4} (dropping 50 and -40); their
    # median is 2 and the 3 values closest to it are 1, 2, 3 -> mean 2.
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [50.0], [-40.0]])
    assert sorted(bulyan_selection(x, 1)) == [0, 1, 2, 3, 4]
    assert float(Bulyan(f=1).aggregate(x, reports(7))) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="4f \\+ 3 = 7"):
        Bulyan(f=1).aggregate(x[:6], reports(6))


# --- norm bounding / centered clipping -----------------------------------------------------------------------------
def test_norm_bounding_hand_case():
    x = torch.tensor([[3.0, 4.0], [0.0, 1.0], [0.0, 2.0]])  # norms 5, 1, 2: median 2
    got = NormBounding().aggregate(x, reports(3))
    torch.testing.assert_close(got, torch.tensor([(1.2 + 0 + 0) / 3, (1.6 + 1 + 2) / 3], dtype=torch.float64))
    got = NormBounding(bound=1.0).aggregate(x, reports(3))
    torch.testing.assert_close(got, torch.tensor([0.6 / 3, (0.8 + 1 + 1) / 3], dtype=torch.float64))


def test_centered_clipping_starts_from_zero_then_from_the_previous_aggregate():
    rule = CenteredClipping()
    state = SimpleNamespace(extra={})
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [10.0, 10.0]])
    rule.begin_round(state, 0)
    first = rule.aggregate(x, reports(3))
    # v0 = 0, distances 1, 1, 14.14: tau = 1; the outlier is scaled to norm 1
    expected = (x[0] + x[1] + x[2] / x[2].norm()).double() / 3
    torch.testing.assert_close(first, expected)
    state = rule.end_round(ServerState(round_idx=0, theta=torch.zeros(2), int_buffers={}))
    torch.testing.assert_close(state.extra[PREVIOUS_KEY], first)
    fresh = CenteredClipping()  # a resumed run: a new rule object reads the centre from the checkpointed state
    fresh.begin_round(state, 1)
    second = fresh.aggregate(x, reports(3))
    d = x.double() - first
    tau = float(np.median(d.norm(dim=1).numpy()))
    ref = first + torch.stack([r * min(1.0, tau / float(r.norm())) for r in d]).mean(dim=0)
    torch.testing.assert_close(second, ref)


# --- FLTrust --------------------------------------------------------------------------------------------------------
class FakeRoot:
    def __init__(self, g0: torch.Tensor, evals: list | None = None):
        self.g0, self.evals, self.calls = g0, evals, 0

    def update(self) -> torch.Tensor:
        return self.g0

    def evaluate(self, delta):
        self.calls += 1
        return self.evals[self.calls - 1]


def test_fltrust_matches_its_formula():
    g0 = torch.tensor([1.0, 0.0, 0.0])
    x = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 0.0], [-3.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
    rule = FLTrust()
    rule.root = FakeRoot(g0)
    got = rule.aggregate(x, reports(4))
    ts = np.array([1.0, 2 ** -0.5, 0.0, 0.0])
    xn = x.numpy().astype(np.float64)
    scaled = xn / np.linalg.norm(xn, axis=1, keepdims=True) * 1.0
    np.testing.assert_allclose(got.numpy(), (ts[:, None] * scaled).sum(axis=0) / ts.sum())
    w = rule.weights(reports(4))
    assert w[2] == w[3] == 0.0 and w[0] == pytest.approx(1 / (1 + 2 ** -0.5))
    with pytest.warns(RuntimeWarning, match="no update"):
        assert float(rule.aggregate(-x[:2], reports(2)).abs().sum()) == 0.0


# --- FLAME ---------------------------------------------------------------------------------------------------------
def test_flame_keeps_the_majority_cluster_and_clips_to_the_median_norm():
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(20, generator=gen, dtype=torch.float64)
    honest = base + 0.05 * torch.randn(7, 20, generator=gen, dtype=torch.float64)
    honest = honest * torch.linspace(0.5, 2.0, 7, dtype=torch.float64)[:, None]  # different norms, same direction
    byz = -base[None, :].repeat(3, 1) * 4 + 0.05 * torch.randn(3, 20, generator=gen, dtype=torch.float64)
    x = torch.cat([honest, byz]).float()
    rule = Flame(cluster_on="updates")
    got = rule.aggregate(x, reports(10))
    w = rule.weights(reports(10))
    xd = x.double().numpy()
    labels = HDBSCAN(metric="precomputed", min_cluster_size=6, min_samples=1, allow_single_cluster=True,
                     copy=True).fit(squareform(pdist(xd, "cosine"))).labels_
    expected = [i for i in range(10) if labels[i] == np.bincount(labels[labels >= 0]).argmax()]
    admitted = [i for i in range(10) if w[i] > 0]
    assert admitted == expected and len(admitted) >= 5 and not set(admitted) & {7, 8, 9}
    s = np.median(np.linalg.norm(xd, axis=1))
    ref = np.mean([r * min(1.0, s / np.linalg.norm(r)) for r in xd[admitted]], axis=0)
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-6)
    # models mode: the same admitted set when the global model is small next to the updates
    rule_models = Flame()
    rule_models.begin_round(SimpleNamespace(theta=torch.zeros(20), extra={}), 0)
    torch.testing.assert_close(rule_models.aggregate(x, reports(10)), got)


def test_flame_noise_is_seeded_and_scaled():
    x = torch.ones(4, 20000) + 0.01 * torch.randn(4, 20000, generator=torch.Generator().manual_seed(0))
    rule = Flame(cluster_on="updates", epsilon=3.0, delta=0.01)
    rule.begin_round(SimpleNamespace(theta=torch.zeros(20000), extra={}), 5)
    noisy = rule.aggregate(x, reports(4))
    clean = Flame(cluster_on="updates").aggregate(x, reports(4))
    s = float(np.median(np.linalg.norm(x.double().numpy(), axis=1)))
    assert float((noisy - clean).std()) == pytest.approx(flame_noise_scale(3.0, 0.01) * s, rel=0.03)
    torch.testing.assert_close(rule.aggregate(x, reports(4)), noisy)  # same (seed, round): same noise
    assert flame_noise_scale(1.0, 1e-3) == pytest.approx(math.sqrt(2 * math.log(1250)))


# --- resfl_robust --------------------------------------------------------------------------------------------------
def root_eval(ufm: float, utility: float = 0.8, se: float = 0.01):
    return SimpleNamespace(ufm_raw=ufm, utility=utility, ufm_se=se)


def robust(n: int, g0: torch.Tensor, evals, **kw) -> RobustResfl:
    rule = RobustResfl(**kw)
    rule.root = FakeRoot(g0, evals)
    return rule


def test_capped_weights_keep_zero_scores_at_zero_and_never_raise_the_cap():
    w = capped_weights(np.array([0.9, 0.05, 0.05, 0.0]), cap=0.4)
    assert w[3] == 0 and w.sum() == pytest.approx(1) and w.max() <= 0.4 + 1e-12
    # two positive scores under a cap of 0.4: each gets the cap, 0.2 of the step stays at the current model (the cap
    # used to be raised to 1/2 here)
    np.testing.assert_allclose(capped_weights(np.array([0.9, 0.1, 0.0]), cap=0.4), [0.4, 0.4, 0.0])


@settings(max_examples=300, deadline=None)
@given(n=st.integers(2, 30), data=st.data())
def test_any_f_clients_hold_at_most_f_over_n_minus_f_whatever_trust_leaves(n, data):
    """The promise of docs/method.md: with cap 1/(n - f), any f clients get at most f/(n - f) of the weight, for any
    scores and any pattern of zero trust (hypothesis over both)."""
    f = data.draw(st.integers(0, (n - 1) // 2), label="f")
    scores = np.array(data.draw(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e3)), min_size=n, max_size=n),
                                label="scores"))
    if not (scores > 0).any():
        scores[data.draw(st.integers(0, n - 1), label="one positive")] = 1.0
    w = capped_weights(scores, 1 / (n - f))
    assert (w >= 0).all() and w.sum() <= 1 + 1e-9 and (w[scores == 0] == 0).all()
    assert np.sort(w)[::-1][:f].sum() <= f / (n - f) + 1e-9  # the f largest weights: the worst subset
    if (scores > 0).sum() >= n - f:
        assert w.sum() == pytest.approx(1)  # enough trusted clients: the full step, as before


def test_a_short_round_moves_by_the_capped_share_of_the_combined_update():
    """Trust leaves 2 of 5 updates positive under cap 1/4: each weighs 1/4 and every combiner's output is scaled by
    the 1/2 they hold (the mean: the plain weighted sum)."""
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [-1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]])
    evals = [root_eval(0.2)] * 5
    g0 = torch.tensor([1.0, 0.0])  # the three negative updates get trust 0
    for combiner, expected in (("mean", 1.0), ("median", 1.0)):  # the median of 1 and 3 at equal weight: 2, x 1/2
        rule = robust(5, g0, evals, beta=0.0, clip="none", f=1, combiner=combiner)
        out = rule.aggregate(x, [report(i, u=0.2) for i in range(5)])
        assert [rule.weights(reports(5))[i] for i in range(5)] == pytest.approx([0.25, 0.25, 0, 0, 0])
        torch.testing.assert_close(out, torch.tensor([expected, 0.0], dtype=out.dtype))


def test_server_mode_ignores_the_reported_u_so_lying_buys_nothing():
    x = torch.tensor([[1.0, 0.1], [1.0, -0.1], [0.9, 0.0], [1.1, 0.05]])
    evals = [root_eval(0.2), root_eval(0.4), root_eval(0.1), root_eval(3.0)]
    honest = robust(4, torch.tensor([1.0, 0.0]), evals, beta=2.0, trust=False, clip="none", f=1)
    out_h = honest.aggregate(x, [report(i, u=ev.ufm_raw) for i, ev in enumerate(evals)])
    liar = robust(4, torch.tensor([1.0, 0.0]), evals, beta=2.0, trust=False, clip="none", f=1)
    out_l = liar.aggregate(x, [report(i, u=0.0) for i in range(4)])  # everyone claims u = 0
    torch.testing.assert_close(out_h, out_l)
    soft = np.exp(-2.0 * np.array([0.2, 0.4, 0.1, 3.0]))
    soft /= soft.sum()
    w = project_capped_simplex(soft, 1 / 3)
    np.testing.assert_allclose([honest.weights(reports(4))[i] for i in range(4)], w)
    np.testing.assert_allclose(out_h.numpy(), (w[:, None] * x.double().numpy()).sum(axis=0))
    assert max(w) <= 1 / 3 + 1e-12


def test_checked_mode_drops_a_report_far_from_the_server_estimate():
    x = torch.ones(4, 3)
    evals = [root_eval(0.5, se=0.05)] * 4
    rule = robust(4, torch.ones(3), evals, mode="checked", check_k=3.0, trust=False, clip="none", f=0)
    reps = [report(0, u=0.5, se=0.05), report(1, u=0.6, se=0.05), report(2, u=0.0, se=0.05),  # 2 lies
            report(3, u=5.0, gated=True)]  # gated: never dropped
    rule.aggregate(x, reps)
    w = rule.weights(reps)
    assert w[2] == 0.0 and w[0] > 0 and w[1] > 0 and w[3] > 0
    assert rule.details["kept"] == [1.0, 1.0, 0.0, 1.0]


def test_a_huge_reported_se_passes_the_check_unless_it_is_bounded_by_the_servers():
    """A liar reporting u = 0 (server estimate 0.5, SE 0.05) with SE 10 passes the check as reported (|0 - 0.5| <= 3 x
    sqrt(0.05^2 + 10^2)) and takes the most weight; with check_se=bounded its SE counts as at most the server's, so
    the check is 3 x sqrt(2) x 0.05 = 0.21 and it is dropped, while an honest report within it is kept."""
    x = torch.ones(3, 2)
    evals = [root_eval(0.5, se=0.05)] * 3
    reps = [report(0, u=0.5, se=0.04), report(1, u=0.6, se=0.05), report(2, u=0.0, se=10.0)]
    for check_se, kept in (("reported", [1.0, 1.0, 1.0]), ("bounded", [1.0, 1.0, 0.0])):
        rule = robust(3, torch.ones(2), evals, mode="checked", check_k=3.0, trust=False, clip="none", f=0,
                      check_se=check_se)
        rule.aggregate(x, reps)
        assert rule.details["kept"] == kept, check_se
    assert rule.weights(reps)[2] == 0.0
    with pytest.raises(ValueError, match="aggregation.check_se must be one of"):
        RobustResfl(check_se="trusted")


def test_trust_zeroes_an_update_against_the_root_and_the_median_combiner_matches_numpy():
    x = torch.tensor([[1.0, 0.0], [2.0, 0.5], [-5.0, 0.0], [1.5, -0.5], [1.2, 0.1]])
    evals = [root_eval(0.3)] * 5
    rule = robust(5, torch.tensor([1.0, 0.0]), evals, clip="norm", f=1, combiner="median")
    out = rule.aggregate(x, reports(5))
    w = rule.weights(reports(5))
    assert w[2] == 0.0 and sum(w.values()) == pytest.approx(1.0) and max(w.values()) <= 0.25 + 1e-12
    equal = robust(5, torch.tensor([1.0, 0.0]), evals, clip="none", trust=False, f=0, combiner="median")
    np.testing.assert_allclose(equal.aggregate(x, reports(5)).numpy(), np.median(x.double().numpy(), axis=0))
    assert out.shape == (2,)


def test_server_u_applies_clip_and_gate():
    p = UfmPolicy(clip_low=0.0, clip_high=5.0, gate=0.3, insufficient_u=5.0)
    assert p.server_u([7.0, -1.0, 0.4, math.nan], [0.9, 0.9, 0.2, 0.9]) == [5.0, 0.0, 5.0, 5.0]


@pytest.mark.parametrize("name", ["bulyan", "norm_bounding", "centered_clipping", "fltrust", "flame"])
def test_each_new_yaml_builds_its_rule(name):
    from omegaconf import OmegaConf

    rule = build_aggregation(OmegaConf.load(CONF / f"{name}.yaml"), report_fim=False)
    assert rule.gathers_all


def test_resfl_robust_yaml_builds_with_the_algorithm_beta():
    from omegaconf import OmegaConf

    node = OmegaConf.merge({"algorithm": {"beta": 1.5}}, {"aggregation": OmegaConf.load(CONF / "resfl_robust.yaml")})
    rule = build_aggregation(node.aggregation, report_fim=False)
    assert isinstance(rule, RobustResfl) and rule.beta == 1.5 and rule.cap(10) == pytest.approx(1 / 7)
