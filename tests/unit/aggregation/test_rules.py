"""Aggregation equals theta + eta * sum_i softmax(-beta u)_i delta_i; FedAvg weights by n_i; streaming == batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from resfl_lightning.aggregation.curvfed import SharpnessAware
from resfl_lightning.aggregation.fedavg import FedAvg
from resfl_lightning.aggregation.median import CoordinateMedian
from resfl_lightning.aggregation.registry import build_aggregation
from resfl_lightning.aggregation.streaming import StreamingWeightedSum, combine_normalisers
from resfl_lightning.aggregation.ufm_softmax import UfmSoftmax
from resfl_lightning.aggregation.uniform import Uniform
from resfl_lightning.config import ConfigError
from resfl_lightning.federation.state import FlatLayout
from resfl_lightning.types import ClientReport


def report(cid: int, u: float = 0.0, n: int = 10, loss: float = 1.0, eig: float = 1.0) -> ClientReport:
    return ClientReport(client_id=cid, num_samples=n, ufm_raw=u, ufm_ema=math.nan, u=u, gated=False,
                        val_utility=0.5, val_utility50=0.5, eval_loss=loss, fim_eigenvalue=eig)


def aggregate(agg, reports, deltas, ranks: int = 1) -> torch.Tensor:
    """Streaming sums split over `ranks` simulated processes, combined like the orchestrator does."""
    accs = [StreamingWeightedSum(deltas[0].numel()) for _ in range(ranks)]
    for i, (r, d) in enumerate(zip(reports, deltas)):
        accs[i % ranks].add(agg.score(r), d)
    gmax, gnorm = combine_normalisers([(a.max_score, a.normaliser) for a in accs])
    return sum(a.rescale_for_global(gmax, gnorm) for a in accs).float()


def test_resfl_weights_match_closed_form_on_toy_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    layout = FlatLayout.of(model)
    theta = layout.flatten(model)
    u = [0.1, 1.5, 4.0, 0.0]
    deltas = [torch.randn_like(theta) for _ in u]
    beta, eta = 2.0, 0.7
    reports = [report(i, u=ui) for i, ui in enumerate(u)]
    expected_w = torch.tensor([math.exp(-beta * x) for x in u])
    expected_w /= expected_w.sum()
    expected = theta + eta * sum(w * d for w, d in zip(expected_w, deltas))
    for ranks in (1, 2, 3):
        got = theta + eta * aggregate(UfmSoftmax(beta=beta), reports, deltas, ranks)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    weights = UfmSoftmax(beta=beta).weights(reports)
    torch.testing.assert_close(torch.tensor([weights[i] for i in range(4)]), expected_w.double().float(),
                               rtol=1e-6, atol=1e-7)
    # The flat vector includes BatchNorm running stats (float buffers) but not num_batches_tracked.
    assert any("running_mean" in k for k in layout.float_keys)
    assert layout.int_keys == ("1.num_batches_tracked",)


def test_beta_zero_is_uniform_and_fedavg_weights_by_n():
    deltas = [torch.full((5,), float(i)) for i in range(4)]
    reports = [report(i, u=i * 1.3, n=n) for i, n in enumerate([10, 30, 20, 40])]
    uniform = aggregate(UfmSoftmax(beta=0.0), reports, deltas)
    torch.testing.assert_close(uniform, torch.full((5,), 1.5))
    torch.testing.assert_close(uniform, aggregate(Uniform(), reports, deltas))
    fedavg = aggregate(FedAvg(), reports, deltas)
    torch.testing.assert_close(fedavg, torch.full((5,), (0 * 10 + 1 * 30 + 2 * 20 + 3 * 40) / 100.0))


def test_streaming_is_stable_for_extreme_scores():
    # beta * u spans 500 nats: naive exp underflows in fp32, the online rescaling must not.
    deltas = [torch.ones(3), 2 * torch.ones(3)]
    reports = [report(0, u=0.0), report(1, u=5.0)]
    out = aggregate(UfmSoftmax(beta=100.0), reports, deltas, ranks=2)
    torch.testing.assert_close(out, torch.ones(3))


def test_curvfed_prefers_low_loss_and_flat_clients():
    w = SharpnessAware(eps=0.005).weights([report(0, loss=1.0, eig=0.1), report(1, loss=1.0, eig=10.0)])
    assert w[0] > w[1]
    expected = torch.softmax(torch.tensor([1 / (0.1 + 0.005), 1 / (10.0 + 0.005)], dtype=torch.float64), 0)
    assert w[0] == pytest.approx(float(expected[0]))


def test_curvfed_weights_for_three_clients_by_hand():
    """Our reading of CurvFed's Eq. 12 (docs/method.md §4; the published body is not yet read): one softmax over
    s_i = 1 / (l_i lambda_i + eps). l = (0.5, 1, 2), lambda = (0.4, 0.1, 1), eps = 0.005: products (0.2, 0.1, 2),
    s = (4.878049, 9.523810, 0.498753), softmax by hand (exp(s_i - 9.523810), normalised)."""
    reports = [report(0, loss=0.5, eig=0.4), report(1, loss=1.0, eig=0.1), report(2, loss=2.0, eig=1.0)]
    w = SharpnessAware(eps=0.005).weights(reports)
    assert [w[i] for i in range(3)] == pytest.approx([0.0095097626, 0.9903710402, 1.191971129e-4], rel=1e-8)
    # a negative eigenvalue (power-iteration noise) counts as flat: the score is 1/eps
    w = SharpnessAware(eps=0.005).weights([report(0, loss=1.0, eig=-0.3), report(1, loss=1.0, eig=0.0)])
    assert [w[0], w[1]] == pytest.approx([0.5, 0.5])


def test_bad_values_are_rejected_with_the_key():
    with pytest.raises(ValueError, match="beta"):
        UfmSoftmax(beta=-1.0)
    with pytest.raises(FloatingPointError):
        StreamingWeightedSum(2).add(0.0, torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="num_samples"):
        FedAvg().score(report(3, n=0))


def test_flat_layout_roundtrip_keeps_parameter_identity():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    layout = FlatLayout.of(model)
    params = [id(p) for p in model.parameters()]
    flat = torch.arange(layout.numel, dtype=torch.float32)
    ints = {k: torch.tensor(7) for k in layout.int_keys}
    layout.load(model, flat, ints)
    assert [id(p) for p in model.parameters()] == params
    torch.testing.assert_close(layout.flatten(model), flat)
    assert int(model[1].num_batches_tracked) == 7
    with pytest.raises(ValueError, match="values"):
        layout.load(model, flat[:-1], ints)


def test_registry_builds_each_rule_from_its_yaml_and_names_bad_keys():
    from tests.helpers import compose_config

    expected = {"fedavg": FedAvg, "uniform": Uniform, "ufm_softmax": UfmSoftmax, "curvfed": SharpnessAware,
                "median": CoordinateMedian}
    for name, cls in expected.items():
        cfg = compose_config(f"aggregation={name}", "algorithm=curvfed")
        assert type(build_aggregation(cfg.aggregation, report_fim=True)) is cls
    assert build_aggregation(compose_config("algorithm=resfl", "algorithm.beta=3.5").aggregation, False).beta == 3.5
    with pytest.raises(ConfigError, match="algorithm.report_fim"):
        build_aggregation(compose_config("aggregation=curvfed").aggregation, report_fim=False)
    with pytest.raises(ConfigError, match="aggregation"):
        build_aggregation(compose_config("aggregation._target_=resfl_lightning.aggregation.nope.Rule").aggregation,
                          report_fim=False)
    with pytest.raises(ConfigError, match="not an AggregationRule"):
        build_aggregation(compose_config("aggregation._target_=collections.OrderedDict").aggregation, False)
    with pytest.raises(ConfigError, match="beta"):
        build_aggregation(compose_config("algorithm.beta=-1").aggregation, report_fim=False)
    with pytest.raises(ConfigError, match=r"aggregation\.beta"):
        build_aggregation(compose_config("aggregation=fairfed", "aggregation.beta=x").aggregation, False)
    with pytest.raises(ConfigError, match=r"aggregation\.bogus"):
        build_aggregation(compose_config("aggregation=median", "+aggregation.bogus=1").aggregation, False)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_coordinate_median_matches_numpy_and_torch(n):
    np = pytest.importorskip("numpy")
    g = torch.Generator().manual_seed(n)
    deltas = torch.randn(n, 50, generator=g)
    deltas[:, 0] = 1.0  # ties
    got = CoordinateMedian().aggregate(deltas, [report(i) for i in range(n)])
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), np.median(deltas.double().numpy(), axis=0), rtol=0, atol=1e-12)
    if n % 2:  # torch.median returns the lower middle value, equal to the median for odd n
        torch.testing.assert_close(got, deltas.median(dim=0).values.double(), rtol=0, atol=0)


def test_median_ignores_a_minority_of_huge_updates():
    honest = [torch.full((4,), 1.0 + 0.01 * i) for i in range(4)]
    attack = [torch.full((4,), -1e6)] * 3
    got = CoordinateMedian().aggregate(torch.stack(honest + attack), [report(i) for i in range(7)])
    assert torch.all((got >= 1.0) & (got <= 1.03))


def test_gather_all_memory_budget_names_rule_and_clients():
    from resfl_lightning.aggregation.base import GatherMemoryError

    CoordinateMedian().check_memory(num_clients=10, numel=1000, budget_mb=1.0)
    with pytest.raises(GatherMemoryError, match=r"CoordinateMedian.*1000 clients.*gather_memory_mb=1"):
        CoordinateMedian().check_memory(num_clients=1000, numel=1000, budget_mb=1.0)
    assert CoordinateMedian().weights([report(3), report(5)]) == {3: 0.5, 5: 0.5}


def test_a_gather_all_rule_sees_every_update_in_a_federation(tmp_path):
    """The orchestrator's gather-all path: theta_G moves by server_lr x the median of the round's client deltas."""
    from tests.federation_helpers import run_federation

    _, state, rec = run_federation(tmp_path, num_clients=5, rounds=2, aggregator=CoordinateMedian(), server_lr=0.5)
    previous = rec.initial
    for r in range(2):
        stacked = torch.stack([rec.deltas[(r, c)] for c in range(5)])
        expected = (previous.double() + 0.5 * stacked.double().median(dim=0).values).float()
        torch.testing.assert_close(rec.thetas[r], expected, rtol=0, atol=0)
        previous = rec.thetas[r]
    assert rec.metrics[-1]["round/aggregated"] == 5.0


def test_gather_all_budget_stops_the_run_before_training(tmp_path):
    from resfl_lightning.aggregation.base import GatherMemoryError
    from tests.federation_helpers import run_federation

    with pytest.raises(GatherMemoryError, match="3 clients"):
        run_federation(tmp_path, num_clients=3, aggregator=CoordinateMedian(), gather_memory_mb=1e-6)
    assert not (tmp_path / "checkpoints" / "last.pt").exists()


@pytest.mark.parametrize(("n", "beta"), [(5, 0.0), (5, 0.2), (7, 0.3), (10, 0.25), (4, 0.49)])
def test_trimmed_mean_matches_scipy(n, beta):
    from scipy.stats import trim_mean

    from resfl_lightning.aggregation.trimmed_mean import TrimmedMean

    deltas = torch.randn(n, 40, generator=torch.Generator().manual_seed(n))
    got = TrimmedMean(beta=beta).aggregate(deltas, [report(i) for i in range(n)])
    expected = trim_mean(deltas.double().numpy(), beta, axis=0)  # cuts floor(beta n) at each end, as specified
    torch.testing.assert_close(got, torch.from_numpy(expected), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="aggregation.beta"):
        TrimmedMean(beta=0.5)


def test_krum_picks_the_hand_computed_client_and_multi_krum_averages_the_best():
    from resfl_lightning.aggregation.krum import Krum, krum_scores

    # 1-d updates 0, 1, 2, 3 and an outlier 100; f = 1: each client sums its n - f - 2 = 2 nearest squared distances.
    deltas = torch.tensor([[0.0], [1.0], [2.0], [3.0], [100.0]])
    expected_scores = [1 + 4, 1 + 1, 1 + 1, 1 + 4, 97**2 + 98**2]
    torch.testing.assert_close(krum_scores(deltas, f=1), torch.tensor(expected_scores, dtype=torch.float64))
    reports = [report(i) for i in range(5)]
    torch.testing.assert_close(Krum(f=1, m=1).aggregate(deltas, reports), torch.tensor([1.0], dtype=torch.float64))
    # Multi-Krum, m = n - f = 4: the four honest updates (scores 5, 2, 2, 5), the outlier left out.
    torch.testing.assert_close(Krum(f=1, m=None).aggregate(deltas, reports), torch.tensor([1.5], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"2f \+ 3 = 5"):
        Krum(f=1).aggregate(deltas[:4], reports[:4])


def test_the_new_rules_build_from_their_yaml():
    from resfl_lightning.aggregation.krum import Krum
    from resfl_lightning.aggregation.trimmed_mean import TrimmedMean
    from tests.helpers import compose_config

    assert type(build_aggregation(compose_config("aggregation=trimmed_mean").aggregation, False)) is TrimmedMean
    multi = build_aggregation(compose_config("aggregation=multi_krum").aggregation, False)
    assert isinstance(multi, Krum) and multi.m is None and multi.f == 1
    with pytest.raises(ConfigError, match=r"aggregation\.f"):
        build_aggregation(compose_config("aggregation=krum", "aggregation.f=one").aggregation, False)


def test_krum_stops_before_training_when_too_few_clients_are_sampled(tmp_path):
    from resfl_lightning.aggregation.krum import Krum
    from tests.federation_helpers import run_federation

    with pytest.raises(ValueError, match=r"2f \+ 3 = 5 updates a round, got 3"):
        run_federation(tmp_path, num_clients=3, aggregator=Krum(f=1))
    assert not (tmp_path / "checkpoints" / "last.pt").exists()


def test_a_round_left_with_too_few_updates_for_krum_is_skipped_not_fatal(tmp_path):
    from resfl_lightning.aggregation.krum import Krum
    from tests.federation_helpers import run_federation

    _, state, rec = run_federation(tmp_path, num_clients=5, rounds=2, aggregator=Krum(f=1),
                                   fail_clients=("0:0:raise",))
    assert rec.metrics[0]["round/skipped"] == 1.0 and rec.metrics[0]["round/aggregated"] == 4.0
    torch.testing.assert_close(rec.thetas[0], rec.initial, rtol=0, atol=0)  # round 0: theta_G unchanged
    assert rec.metrics[1]["round/skipped"] == 0.0 and not torch.equal(rec.thetas[1], rec.thetas[0])
    assert state.round_idx == 1


# --- effective weights: how much of the aggregate came from each client (the logged weights) ----------------------
def _effective_rules():
    from resfl_lightning.aggregation.bulyan import Bulyan
    from resfl_lightning.aggregation.krum import Krum
    from resfl_lightning.aggregation.trimmed_mean import TrimmedMean

    return [CoordinateMedian(), TrimmedMean(beta=0.2), Krum(f=1, m=1), Krum(f=1, m=None), Bulyan(f=1)]


@pytest.mark.parametrize("n", [7, 8])
@pytest.mark.parametrize("rule", range(5))
def test_effective_weights_are_each_coordinates_coefficients_averaged(n, rule):
    """On one coordinate each rule's aggregate is sum_i w_i d_i with the weights it logs; over P coordinates the logged
    weight is the mean of the P one-coordinate weights (Krum and Multi-Krum pick whole updates, so the same on every
    coordinate). They sum to 1; a client the rule never takes gets 0."""
    torch.manual_seed(n + rule)
    deltas = torch.randn(n, 6, dtype=torch.float64)
    deltas[0] = 50.0  # an outlier no rule here takes
    reps = [report(i) for i in range(n)]
    whole = _effective_rules()[rule]
    full = whole.aggregate(deltas, reps)
    w = whole.weights(reps)
    assert sum(w.values()) == pytest.approx(1.0) and w[0] == 0.0
    if rule in (2, 3):  # Krum / Multi-Krum: the mean of the picked rows, with the logged weights
        assert torch.allclose(full, sum(w[i] * deltas[i] for i in range(n)))
        return
    if rule == 4:  # Bulyan picks its rows on whole updates, then per coordinate: python loops over that selection
        from resfl_lightning.aggregation.bulyan import bulyan_selection

        chosen = bulyan_selection(deltas, 1)
        keep, expected = len(chosen) - 2, [0.0] * n
        for c in range(deltas.shape[1]):
            values = [float(deltas[i, c]) for i in chosen]
            med = float(np.median(values))
            closest = sorted(range(len(chosen)), key=lambda j: abs(values[j] - med))[:keep]
            assert float(full[c]) == pytest.approx(sum(values[j] for j in closest) / keep)
            for j in closest:
                expected[chosen[j]] += 1 / keep / deltas.shape[1]
        assert [w[i] for i in range(n)] == pytest.approx(expected)
        return
    per_column = []
    for c in range(deltas.shape[1]):
        one = _effective_rules()[rule]
        value = one.aggregate(deltas[:, c:c + 1], reps)
        wc = one.weights(reps)
        assert torch.allclose(value, sum(wc[i] * deltas[i, c:c + 1] for i in range(n)))  # the coefficients
        assert value == pytest.approx(float(full[c]))
        per_column.append([wc[i] for i in range(n)])
    assert [w[i] for i in range(n)] == pytest.approx(torch.tensor(per_column).mean(dim=0).tolist())


def test_krum_logs_one_for_the_client_it_picks_not_an_equal_vote():
    from resfl_lightning.aggregation.krum import Krum

    deltas = torch.tensor([[0.0], [0.1], [0.2], [0.15], [9.0]], dtype=torch.float64)
    rule, reps = Krum(f=1, m=1), [report(i) for i in range(5)]
    rule.aggregate(deltas, reps)
    # hand-computed: scores over the n - f - 2 = 2 nearest: client 3 (0.05^2 + 0.05^2) is lowest
    assert rule.weights(reps) == {0: 0.0, 1: 0.0, 2: 0.0, 3: 1.0, 4: 0.0}
    assert Krum(f=1, m=1).weights(reps) == {i: 0.2 for i in range(5)}  # nothing aggregated yet: one vote each
