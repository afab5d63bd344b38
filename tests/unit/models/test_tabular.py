"""TabularNet: architecture, output shapes, the evidential head, and input validation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from resfl_lightning.models.tabular import TabularNet

torch.set_num_threads(1)


def test_default_architecture_is_mlp_256_128_64_with_batchnorm_and_relu():
    net = TabularNet(105)
    kinds = [type(m) for m in net.body]
    assert kinds == [nn.Linear, nn.BatchNorm1d, nn.ReLU] * 3
    linears = [m for m in net.body if isinstance(m, nn.Linear)] + [net.head]
    assert [(m.in_features, m.out_features) for m in linears] == [(105, 256), (256, 128), (128, 64), (64, 2)]
    assert [m.num_features for m in net.body if isinstance(m, nn.BatchNorm1d)] == [256, 128, 64]
    assert net.feature_dim == 64
    assert net.head_parameters == [net.head.weight, net.head.bias]


def test_forward_shapes_and_dirichlet_alpha():
    torch.manual_seed(0)
    net = TabularNet(7, hidden=(16, 8), num_classes=3)
    out = net(torch.randn(5, 7))
    assert out.features.shape == (5, 8) and out.logits.shape == (5, 3) and out.alpha.shape == (5, 3)
    assert torch.allclose(out.alpha, 1.0 + F.softplus(out.logits))
    assert (out.alpha > 1).all()
    # h is the post-ReLU penultimate activation that the head reads.
    assert (out.features >= 0).all()
    assert torch.allclose(out.logits, net.head(out.features))


def test_eval_mode_uses_running_stats_so_rows_are_independent():
    torch.manual_seed(1)
    net = TabularNet(4, hidden=(8,))
    net(torch.randn(64, 4))  # one train-mode pass fills the running statistics
    net.eval()
    x = torch.randn(6, 4)
    full = net(x).alpha
    one_by_one = torch.cat([net(x[i : i + 1]).alpha for i in range(6)])
    assert torch.allclose(full, one_by_one, atol=1e-6)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match=r"\(B, 105\)"):
        TabularNet(105)(torch.randn(3, 104))
    with pytest.raises(ValueError, match="model.hidden"):
        TabularNet(10, hidden=())
    with pytest.raises(ValueError, match="model.hidden"):
        TabularNet(10, hidden=(8, 0))
    with pytest.raises(ValueError, match="num_features"):
        TabularNet(0)
    with pytest.raises(ValueError, match="num_classes"):
        TabularNet(10, num_classes=1)
