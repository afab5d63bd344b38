"""Update-aware AIA features: layout handling, hand-checked statistics, and a probe that reads them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from resfl_lightning.attacks.aia import train_attribute_probe
from resfl_lightning.attacks.update_features import (
    dominant_group,
    resolve_layout,
    update_feature_names,
    update_features,
)

LAYOUT = [("backbone.0.weight", 6), ("backbone.0.bias", 2), ("head.cls.weight", 4)]


def test_hand_checked_vector():
    delta = torch.tensor([1.0, -2.0, 0.0, 3.0, -1.0, 1.0,  # backbone.0.weight
                          0.5, 0.5,                          # backbone.0.bias
                          -4.0, 2.5, 0.0, 2.0])              # head.cls.weight
    v = update_features(delta, LAYOUT, head_prefixes=("head.",), top_k=3)
    assert v.shape == (3 * 3 + 3,) and v.dtype == np.float64
    l2, sign, hist, head = v[:3], v[3:6], v[6:9], v[9:]
    np.testing.assert_allclose(l2, [np.sqrt(1 + 4 + 9 + 1 + 1), np.sqrt(0.5), np.sqrt(16 + 6.25 + 4)])
    np.testing.assert_allclose(sign, [3 / 6, 2 / 2, 2 / 4])  # zeros are not positive
    # Three largest |delta|: -4 (head), 3 (backbone.weight), 2.5 (head).
    np.testing.assert_allclose(hist, [1 / 3, 0.0, 2 / 3])
    head_vals = np.array([-4.0, 2.5, 0.0, 2.0])
    np.testing.assert_allclose(head, [head_vals.mean(), head_vals.std(), 4.0])
    assert len(update_feature_names(LAYOUT)) == v.size


def test_concentrated_delta_puts_topk_mass_on_that_layer():
    rng = np.random.default_rng(0)
    layout = [(f"layer{i}.weight", n) for i, n in enumerate([500, 300, 800, 50])] + [("head.w", 40)]
    total = sum(n for _, n in layout)
    delta = 1e-3 * rng.normal(size=total)
    start = 500 + 300
    delta[start:start + 800] = rng.normal(size=800)  # layer2 carries almost all the update
    v = update_features(delta, layout, head_prefixes=["head."], top_k=100)
    hist = v[2 * 5:3 * 5]
    assert hist[2] == pytest.approx(1.0) and hist.sum() == pytest.approx(1.0)
    assert int(np.argmax(v[:5])) == 2


def test_fixed_length_and_mapping_inputs_agree():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    sd = model.state_dict()  # includes an integer num_batches_tracked buffer, which must be skipped
    float_sd = {k: v for k, v in sd.items() if v.is_floating_point()}
    gen = torch.Generator().manual_seed(0)
    deltas = {k: torch.randn(v.shape, generator=gen) if v.is_floating_point() else v for k, v in sd.items()}
    flat = torch.cat([deltas[k].reshape(-1) for k in float_sd])
    a = update_features(deltas, head_prefixes="3.", top_k=10)
    b = update_features(flat, float_sd, head_prefixes="3.", top_k=10)
    c = update_features(flat, [(k, v.numel()) for k, v in float_sd.items()], head_prefixes="3.", top_k=10)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    assert a.shape == (3 * len(float_sd) + 3,)
    other = update_features(100 * torch.randn(flat.numel(), generator=gen), float_sd, head_prefixes="3.", top_k=10)
    assert other.shape == a.shape  # length depends only on the layout
    _, pairs = resolve_layout(deltas)
    assert [n for n, _ in pairs] == list(float_sd)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="layout sums to 12"):
        update_features(torch.zeros(11), LAYOUT, head_prefixes="head.")
    with pytest.raises(ValueError, match="no layer name starts with"):
        update_features(torch.zeros(12), LAYOUT, head_prefixes="detect.")
    with pytest.raises(ValueError, match="needs a layout"):
        update_features(torch.zeros(12), head_prefixes="head.")
    with pytest.raises(ValueError, match="non-finite"):
        update_features(torch.full((12,), float("nan")), LAYOUT, head_prefixes="head.")


def test_dominant_group():
    assert dominant_group(np.array([2, 2, 1, -1, -1, -1]), num_groups=3) == 2
    assert dominant_group(torch.tensor([0, 1]), num_groups=3) == 0  # tie -> lower index
    with pytest.raises(ValueError, match="no person"):
        dominant_group([-1, -1], num_groups=3)


def test_probe_reads_group_from_update_vectors():
    # Clients whose dominant group shifts the head update in a group-specific direction: the probe finds it.
    rng = np.random.default_rng(0)
    layout = [("backbone.w", 64), ("neck.w", 32), ("head.w", 16)]
    directions = rng.normal(size=(3, 16))
    vecs, labels = [], []
    for i in range(600):
        group = i % 3
        delta = 0.1 * rng.normal(size=112)
        delta[96:] += 0.5 * directions[group] + 0.05 * rng.normal(size=16)
        delta[:64] *= 1.0 + group  # backbone scale also differs per group
        vecs.append(update_features(delta, layout, head_prefixes="head.", top_k=20))
        labels.append(group)
    res = train_attribute_probe(np.stack(vecs), np.array(labels), num_groups=3, seed=0, epochs=30, batch_size=64)
    assert res["balanced_accuracy"] > 0.9 > res["chance_majority"]
