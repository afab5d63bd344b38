"""Gradient Reversal Layer: identity forward, parameter gradients upstream equal -lambda times those without it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from resfl_lightning.losses.grl import GradientReversal, gradient_reversal

torch.set_num_threads(1)


def _nets(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    encoder = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 6))
    head = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
    return encoder, head


def _grads(encoder: nn.Module, head: nn.Module, x: torch.Tensor, y: torch.Tensor, grl: nn.Module | None):
    encoder.zero_grad()
    head.zero_grad()
    h = encoder(x)
    if grl is not None:
        h = grl(h)
    nn.functional.cross_entropy(head(h), y).backward()
    return [p.grad.clone() for p in encoder.parameters()], [p.grad.clone() for p in head.parameters()]


def test_forward_is_identity():
    x = torch.randn(7, 6, requires_grad=True)
    out = GradientReversal(0.7)(x)
    assert torch.equal(out, x)
    assert out.requires_grad


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0, 2.5])
def test_upstream_gradients_are_reversed_and_scaled(lam: float):
    encoder, head = _nets()
    x = torch.randn(10, 5)
    y = torch.randint(0, 3, (10,))
    enc_plain, head_plain = _grads(encoder, head, x, y, None)
    enc_rev, head_rev = _grads(encoder, head, x, y, GradientReversal(lam))
    assert any(g.abs().max() > 1e-4 for g in enc_plain)
    for a, b in zip(enc_rev, enc_plain, strict=True):
        torch.testing.assert_close(a, -lam * b, rtol=1e-6, atol=1e-7)
    # The head (adversary side) is downstream of the GRL and trains normally.
    for a, b in zip(head_rev, head_plain, strict=True):
        torch.testing.assert_close(a, b)


def test_scale_can_change_between_steps_and_functional_form_matches():
    x = torch.randn(4, 3, requires_grad=True)
    grl = GradientReversal(1.0)
    grl.scale = 0.25
    grl(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, -0.25))
    x.grad = None
    (gradient_reversal(x, 2.0) * 3.0).sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, -6.0))


def test_negative_scale_rejected():
    with pytest.raises(ValueError, match="scale"):
        GradientReversal(-0.1)
    grl = GradientReversal(1.0)
    with pytest.raises(ValueError, match="scale"):
        grl.scale = float("nan")
    with pytest.raises(ValueError, match="scale"):
        gradient_reversal(torch.zeros(2), -1.0)
