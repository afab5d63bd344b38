"""Aggregation equals theta + eta * sum_i softmax(-beta u)_i delta_i; FedAvg weights by n_i; streaming == batch."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from resfl_lightning.federation.aggregation import (
    FedAvg,
    SharpnessAware,
    StreamingWeightedSum,
    UfmSoftmax,
    Uniform,
    build_aggregator,
    combine_normalisers,
)
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


def test_bad_values_are_rejected_with_the_key():
    with pytest.raises(ValueError, match="beta"):
        UfmSoftmax(beta=-1.0)
    with pytest.raises(ValueError, match="aggregation"):
        build_aggregator("median")
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
