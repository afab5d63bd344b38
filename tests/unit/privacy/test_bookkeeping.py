"""privacy/bookkeeping.py: per-example norms and clipped sums of Linear layers from their factors, against opacus'
materialised per-sample gradients (its own Linear grad sampler and DPOptimizer)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.grad_sample.linear import compute_linear_grad_sample
from torch import nn

from resfl_lightning.models.tabular import TabularNet
from resfl_lightning.privacy import bookkeeping
from resfl_lightning.privacy.dp import ClientDPOptimizer, prepare_model
from tests.unit.privacy.test_grad_sample_store import Shared  # one Linear used twice in a forward

torch.set_num_threads(1)


def test_factors_give_opacus_norms_and_clipped_sums():
    """||g_i a_i^T|| = ||g_i|| ||a_i|| and sum_i c_i g_i a_i^T = (c g)^T a, against opacus' per-sample tensors."""
    gen = torch.Generator().manual_seed(0)
    layer = nn.Linear(7, 5)
    a, g = torch.randn(9, 7, generator=gen), torch.randn(9, 5, generator=gen)
    clip = torch.rand(9, generator=gen)
    theirs = compute_linear_grad_sample(layer, [a], g)
    ours = bookkeeping.factored_linear_grad_sample(layer, [a], g)
    for p in (layer.weight, layer.bias):
        placeholder, full = ours[p], theirs[p]
        assert bookkeeping.is_factored(placeholder) and placeholder.shape == full.shape
        assert all(s == 0 for s in placeholder.stride())  # nothing B x out x in is allocated
        torch.testing.assert_close(bookkeeping.materialise(placeholder), full, rtol=0, atol=0)
        torch.testing.assert_close(bookkeeping.per_sample_norms(placeholder), full.reshape(9, -1).norm(dim=1))
        torch.testing.assert_close(bookkeeping.clipped_sum(placeholder, clip, torch.float32),
                                   torch.einsum("i,i...", clip, full))


def test_a_linear_over_sequences_keeps_opacus_per_sample_gradients():
    layer = nn.Linear(4, 3)
    out = bookkeeping.factored_linear_grad_sample(layer, [torch.randn(2, 6, 4)], torch.randn(2, 6, 3))
    assert not any(bookkeeping.is_factored(v) for v in out.values())


def dp_steps(make, wrapper, x, y, backwards=1, steps=3):
    """`steps` noisy DP-SGD steps (momentum, clipping that binds for some samples), each after `backwards`
    backward passes; the same seed gives the same init and noise."""
    torch.manual_seed(7)
    model = make()
    wrapped = wrapper(model, loss_reduction="mean")
    opt = ClientDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), noise_multiplier=0.7,
                            max_grad_norm=0.5, expected_batch_size=len(x) * backwards)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        for _ in range(backwards):
            out = wrapped(x)
            F.cross_entropy(out.logits if hasattr(out, "logits") else out, y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("make", "features", "backwards"),
                         [(lambda: prepare_model(TabularNet(12, hidden=(16, 8))), 12, 1), (Shared, 6, 1),
                          (lambda: prepare_model(TabularNet(12, hidden=(16, 8))), 12, 2)],
                         ids=["tabular_groupnorm", "shared_layer", "two_backwards_per_step"])
def test_dp_steps_equal_opacus_per_sample_path_to_rounding(make, features, backwards):
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, features, generator=gen) * 3, torch.randint(0, 2, (32,), generator=gen)
    ours = dp_steps(make, bookkeeping.BookkeepingGradSampleModule, x, y, backwards)
    theirs = dp_steps(make, GradSampleModule, x, y, backwards)
    torch.manual_seed(7)
    start = [p.detach() for p in make().parameters()]
    for a, b, p0 in zip(ours, theirs, start, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert not torch.equal(a, p0)  # every parameter moved


def test_an_unfinished_step_leaves_no_placeholder_behind():
    """zero_grad drops the factors with the grad samples: a layer's (a, g) never leaks into the next step."""
    model = prepare_model(TabularNet(12, hidden=(16, 8)))
    wrapped = bookkeeping.BookkeepingGradSampleModule(model, loss_reduction="mean")
    opt = ClientDPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), noise_multiplier=0.0, max_grad_norm=1.0,
                            expected_batch_size=8)
    F.cross_entropy(wrapped(torch.randn(8, 12)).logits, torch.randint(0, 2, (8,))).backward()
    assert any(bookkeeping.is_factored(p.grad_sample) for p in model.parameters())
    opt.zero_grad(set_to_none=True)
    assert all(p.grad_sample is None for p in model.parameters())
