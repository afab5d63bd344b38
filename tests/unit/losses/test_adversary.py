"""Adversary MLP behind the GRL, its masked cross-entropy, and ROIAlign pooling of neck features."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss

from resfl_lightning.losses.adversary import Adversary, adversarial_loss, roi_pool_features

torch.set_num_threads(1)


def test_adversary_architecture_and_shapes():
    adv = Adversary(in_dim=448, num_groups=10)
    linears = [m for m in adv.mlp if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(448, 128), (128, 10)]
    assert isinstance(adv.mlp[1], torch.nn.ReLU) and isinstance(adv.mlp[2], torch.nn.Dropout)
    assert adv(torch.randn(5, 448)).shape == (5, 10)
    with pytest.raises(ValueError, match="448"):
        adv(torch.randn(5, 447))


def test_adversarial_loss_matches_sklearn_log_loss_on_known_groups():
    torch.manual_seed(0)
    adv = Adversary(in_dim=6, num_groups=3).eval()
    feats = torch.randn(9, 6)
    groups = torch.tensor([0, 2, -1, 1, 1, -1, 0, 2, 2])
    loss = adversarial_loss(adv, feats, groups)
    known = (groups >= 0).numpy()
    with torch.no_grad():
        probs = torch.softmax(adv(feats), dim=1).numpy()
    ref = log_loss(groups.numpy()[known], probs[known], labels=[0, 1, 2])
    assert loss.item() == pytest.approx(ref, rel=1e-5)


def test_adversarial_loss_trains_adversary_and_reverses_into_features():
    torch.manual_seed(1)
    adv = Adversary(in_dim=4, num_groups=2, dropout=0.0, grl_scale=0.5)
    feats = torch.randn(6, 4, requires_grad=True)
    groups = torch.tensor([0, 1, 0, 1, -1, 1])
    adversarial_loss(adv, feats, groups).backward()
    grl_grad = feats.grad.clone()
    # Same loss without the GRL: the adversary's own gradients are identical, feature gradients flip sign x 0.5.
    adv_grads = [p.grad.clone() for p in adv.parameters()]
    adv.zero_grad()
    feats.grad = None
    known = groups >= 0
    torch.nn.functional.cross_entropy(adv.mlp(feats[known]), groups[known]).backward()
    torch.testing.assert_close(grl_grad, -0.5 * feats.grad)
    assert grl_grad[4].abs().sum() == 0  # unknown group contributes nothing
    for a, p in zip(adv_grads, adv.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad)


def test_adversarial_loss_without_known_groups_is_graph_connected_zero():
    adv = Adversary(in_dim=4, num_groups=3)
    feats = torch.randn(3, 4, requires_grad=True)
    loss = adversarial_loss(adv, feats, torch.full((3,), -1))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() == 0 for p in adv.parameters())
    empty = adversarial_loss(adv, torch.randn(0, 4), torch.zeros(0, dtype=torch.long))
    assert empty.item() == 0.0 and empty.requires_grad


def test_adversarial_loss_rejects_bad_groups():
    adv = Adversary(in_dim=4, num_groups=3)
    with pytest.raises(ValueError, match="out of range"):
        adversarial_loss(adv, torch.randn(2, 4), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="group labels"):
        adversarial_loss(adv, torch.randn(2, 4), torch.tensor([0]))


def _pyramid(batch: int = 2, size: int = 64, strides=(8, 16, 32), channels=(3, 5, 4)):
    torch.manual_seed(0)
    return [torch.randn(batch, c, size // s, size // s) for c, s in zip(channels, strides, strict=True)], list(strides)


def test_roi_pool_features_shape_and_level_order():
    maps, strides = _pyramid()
    # Image 1 is constant per level and channel; the pooled vector must be those constants, level by level.
    consts = [torch.arange(m.shape[1], dtype=torch.float32) + 10.0 * (lvl + 1) for lvl, m in enumerate(maps)]
    for m, c in zip(maps, consts, strict=True):
        m[1] = c[:, None, None]
    boxes = torch.tensor([[4.0, 6.0, 40.0, 50.0], [10.0, 12.0, 30.0, 60.0], [0.0, 0.0, 64.0, 64.0]])
    batch_idx = torch.tensor([0, 1, 1])
    out = roi_pool_features(maps, strides, boxes, batch_idx)
    assert out.shape == (3, 3 + 5 + 4)
    expected = torch.cat(consts)
    torch.testing.assert_close(out[1], expected)
    torch.testing.assert_close(out[2], expected)
    assert not torch.allclose(out[0], expected)  # image 0 is random: batch_idx routing matters


def test_roi_pool_features_constant_subregion():
    fmap = torch.randn(1, 2, 8, 8)  # stride 8, a 64x64 image
    fmap[0, :, 2:6, 2:6] = torch.tensor([3.0, -1.5])[:, None, None]
    # Pixel box 20..44 maps to feature coords 2.0..5.0 (aligned: x/8 - 0.5): every bilinear sample sees the constant.
    out = roi_pool_features([fmap], [8], torch.tensor([[20.0, 20.0, 44.0, 44.0]]), torch.tensor([0]))
    torch.testing.assert_close(out, torch.tensor([[3.0, -1.5]]))
    # A box reaching outside the constant patch must not return the constant (the check can fail).
    out2 = roi_pool_features([fmap], [8], torch.tensor([[0.0, 0.0, 44.0, 44.0]]), torch.tensor([0]))
    assert not torch.allclose(out2, torch.tensor([[3.0, -1.5]]))


def test_roi_pool_features_gradients_and_empty_and_validation():
    maps, strides = _pyramid()
    maps = [m.requires_grad_() for m in maps]
    out = roi_pool_features(maps, strides, torch.tensor([[4.0, 4.0, 30.0, 30.0]]), torch.tensor([1]), output_size=5)
    out.sum().backward()
    assert all(m.grad[1].abs().sum() > 0 and m.grad[0].abs().sum() == 0 for m in maps)
    empty = roi_pool_features(maps, strides, torch.zeros(0, 4), torch.zeros(0))
    assert empty.shape == (0, 12)
    with pytest.raises(ValueError, match="strides"):
        roi_pool_features(maps, strides[:2], torch.zeros(1, 4), torch.zeros(1))
    with pytest.raises(ValueError, match="batch_idx"):
        roi_pool_features(maps, strides, torch.zeros(1, 4), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"\(M, 4\)"):
        roi_pool_features(maps, strides, torch.zeros(1, 5), torch.tensor([0]))


def test_adversary_on_pooled_features_end_to_end():
    maps, strides = _pyramid()
    maps = [m.requires_grad_() for m in maps]
    h = roi_pool_features(
        maps, strides, torch.tensor([[4.0, 4.0, 30.0, 30.0], [8.0, 8.0, 60.0, 40.0]]), torch.tensor([0, 1])
    )
    adv = Adversary(in_dim=h.shape[1], num_groups=4)
    loss = adversarial_loss(adv, h, torch.tensor([3, 0]))
    loss.backward()
    assert np.isfinite(loss.item())
    assert all(m.grad.abs().sum() > 0 for m in maps)
