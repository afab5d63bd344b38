"""Server SWA against torch.optim.swa_utils: the running average equals AveragedModel on the same sequence of
models, the federated BatchNorm recalibration equals update_bn on the clients' pooled batches, and the schedule
(FedSWA's s0 = ceil(0.75 R), c = 1) always averages the final round."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, update_bn

from resfl_lightning.algorithms.base import Algorithm
from resfl_lightning.federation.orchestrator import FederationSettings
from resfl_lightning.federation.state import FlatLayout
from resfl_lightning.federation.swa import (
    batchnorm_layers,
    client_bn_statistics,
    combine_bn_statistics,
    statistic_mask,
    swa_step,
    write_bn_statistics,
)
from resfl_lightning.models.tabular import TabularNet

torch.set_num_threads(1)


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    net = TabularNet(5, hidden=(8, 6), num_classes=2)
    with torch.no_grad():  # distinct BatchNorm buffers too, so "not averaged" is visible
        for m in batchnorm_layers(net).values():
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    return net


def test_swa_average_equals_averaged_model_and_copies_the_latest_bn_buffers():
    models = [_net(s) for s in range(4)]
    layout = FlatLayout.of(models[0])
    keep = statistic_mask(layout, batchnorm_layers(models[0]))
    assert int(keep.sum()) == 2 * (8 + 6)
    reference = AveragedModel(models[0])  # use_buffers=False: buffers follow the latest model
    swa, count = None, 0
    for m in models:
        reference.update_parameters(m)
        swa = swa_step(swa, count, layout.flatten(m), buffers=keep)
        count += 1
    expected = copy.deepcopy(models[0])
    expected.load_state_dict(reference.module.state_dict())
    torch.testing.assert_close(swa, layout.flatten(expected), rtol=1e-6, atol=1e-7)
    # the plain average of every entry differs from it exactly at the BatchNorm statistics
    plain = torch.stack([layout.flatten(m) for m in models]).mean(0)
    assert not torch.allclose(plain[keep], swa[keep]) and torch.allclose(plain[~keep], swa[~keep], atol=1e-6)


def test_federated_bn_recalibration_equals_update_bn_on_the_pooled_batches():
    torch.manual_seed(0)
    net = _net(7)
    layout = FlatLayout.of(net)
    # two clients with different sizes and batch counts (3 and 2 batches; the last ones are short)
    clients = [[torch.randn(b, 5) * 2 + 1 for b in (16, 16, 9)], [torch.randn(b, 5) - 3 for b in (16, 5)]]
    parts = []
    for batches in clients:
        model = copy.deepcopy(net)
        momenta = [m.momentum for m in batchnorm_layers(model).values()]
        parts.append(client_bn_statistics(model, model, batches))
        assert [m.momentum for m in batchnorm_layers(model).values()] == momenta and model.training
    stats = combine_bn_statistics(parts)
    reference = copy.deepcopy(net)
    update_bn([x for batches in clients for x in batches], reference)
    for name, m in batchnorm_layers(reference).items():
        mean, var, batches = stats[name]
        torch.testing.assert_close(mean, m.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(var, m.running_var, rtol=1e-5, atol=1e-6)
        assert batches == int(m.num_batches_tracked) == 5
    # weighting by rows instead of batches would not match update_bn here (unequal batch sizes)
    flat = write_bn_statistics(layout.flatten(net), layout, stats)
    layout.load(net, flat, layout.int_buffers(net))
    for name, m in batchnorm_layers(net).items():
        torch.testing.assert_close(m.running_mean, batchnorm_layers(reference)[name].running_mean,
                                   rtol=1e-5, atol=1e-6)
    keep = statistic_mask(layout, batchnorm_layers(net))
    torch.testing.assert_close(flat[~keep], layout.flatten(reference)[~keep])  # parameters untouched


def test_recalibration_leaves_the_global_rng_untouched():
    net = _net(1)
    loader = torch.utils.data.DataLoader(torch.randn(20, 5), batch_size=8)
    before = torch.get_rng_state()
    client_bn_statistics(net, net, loader)
    assert torch.equal(before, torch.get_rng_state())


@pytest.mark.parametrize(("rounds", "start", "every", "averaged"), [
    (14, 0.75, 1, [11, 12, 13]),           # FedSWA: s0 = ceil(10.5) = 11, the last quarter
    (100, 0.75, 1, list(range(75, 100))),  # 25 models, the final one included
    (14, 0.2, 3, [5, 8, 11, 13]),          # CurvFed-style cycles: round 13 ends no cycle but is the final round
    (2, 0.75, 1, [1]),                     # s0 = ceil(1.5) = 2 > R - 1: the final round alone
    (80, 0.2, 5, [20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 79]),  # CurvFed: 16 of 80, c = 5
])
def test_swa_schedule_always_includes_the_final_round(rounds, start, every, averaged):
    s0 = Algorithm(_target_="x", name="x", swa_start=start, swa_every=every).swa_start_round(rounds)
    s = FederationSettings(rounds=rounds, swa_start=s0, swa_every=every)
    assert [r for r in range(rounds) if s.swa_cycle_end(r)] == averaged
