"""privacy/grad_sample_store.py: opacus' per-sample gradient storage without its zero-filled copy, bitwise the same."""

from __future__ import annotations

import opacus.grad_sample.grad_sample_module as grad_sample_module
import pytest
import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch import nn

from resfl_lightning.models.tabular import TabularNet
from resfl_lightning.privacy import grad_sample_store
from resfl_lightning.privacy.dp import prepare_model


class Shared(nn.Module):
    """One Linear used twice in a forward: opacus accumulates its per-sample gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(6, 6)
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        return self.head(torch.relu(self.inner(torch.relu(self.inner(x)))))


def dp_steps(make, x, y, steps=3):
    torch.manual_seed(7)
    model = make()
    wrapped = GradSampleModule(model, loss_reduction="mean")
    opt = DPOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), noise_multiplier=0.7,
                      max_grad_norm=0.5, expected_batch_size=len(x))
    samples = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        out = wrapped(x)
        F.cross_entropy(out.logits if hasattr(out, "logits") else out, y).backward()
        samples.append([p.grad_sample.clone() for p in model.parameters()])
        opt.step()
    return [p.detach().clone() for p in model.parameters()], samples


@pytest.mark.parametrize("make", [lambda: prepare_model(TabularNet(12, hidden=(16, 8))), Shared],
                         ids=["tabular_groupnorm", "shared_layer"])
def test_dp_steps_are_bitwise_the_same_as_opacus_own_storage(make):
    x = torch.randn(32, 12 if make is not Shared else 6)
    y = torch.randint(0, 2, (32,))
    torch.manual_seed(0)
    mine, my_samples = dp_steps(make, x, y)
    grad_sample_store.uninstall()
    try:
        torch.manual_seed(0)
        theirs, their_samples = dp_steps(make, x, y)
    finally:
        grad_sample_store.install()
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)
    for step_a, step_b in zip(my_samples, their_samples, strict=True):
        for a, b in zip(step_a, step_b, strict=True):
            assert torch.equal(a, b)


def test_the_project_storage_is_what_opacus_hook_calls():
    assert grad_sample_module.create_or_accumulate_grad_sample is grad_sample_store.store


def test_a_full_batch_is_kept_without_a_copy_and_a_second_add_leaves_it_untouched():
    param = nn.Parameter(torch.zeros(3))
    first, second = torch.randn(4, 3), torch.randn(4, 3)
    kept = first.clone()
    grad_sample_store.store(param=param, grad_sample=first, max_batch_len=4)
    assert param._current_grad_sample is first  # no zero-filled copy
    grad_sample_store.store(param=param, grad_sample=second, max_batch_len=4)
    assert torch.equal(first, kept)  # the sampler's tensor was not added into
    assert torch.equal(param._current_grad_sample, kept + second)


def test_a_shorter_batch_and_a_view_take_opacus_path():
    param = nn.Parameter(torch.zeros(3))
    short = torch.randn(2, 3)
    grad_sample_store.store(param=param, grad_sample=short, max_batch_len=4)
    assert param._current_grad_sample.shape == (4, 3)
    assert torch.equal(param._current_grad_sample[2:], torch.zeros(2, 3))
    other = nn.Parameter(torch.zeros(3))
    base = torch.randn(4, 6)
    view = base[:, :3]
    grad_sample_store.store(param=other, grad_sample=view, max_batch_len=4)
    assert other._current_grad_sample is not view and torch.equal(other._current_grad_sample, view)
    frozen = nn.Parameter(torch.zeros(3), requires_grad=False)
    grad_sample_store.store(param=frozen, grad_sample=torch.randn(4, 3), max_batch_len=4)
    assert not hasattr(frozen, "_current_grad_sample")
