"""Attribute inference probe: learns an encoded group, stays at chance on shuffled labels, deterministic."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score

from resfl_lightning.attacks.aia import aia_success_rate, train_attribute_probe

G = 4


def _encoded(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Group one-hot (scaled) plus Gaussian noise and distractor columns."""
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, G, size=n)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    x[:, :G] += 4.0 * np.eye(G, dtype=np.float32)[groups]
    return x, groups


def test_probe_recovers_encoded_group():
    x, g = _encoded(3000, seed=0)
    res = train_attribute_probe(x, g, num_groups=G, seed=0)
    assert res["top1"] > 0.95
    assert aia_success_rate(res) == res["top1"]
    assert res["n_train"] + res["n_val"] + res["n_test"] == 3000
    assert (res["n_train"], res["n_val"], res["n_test"]) == (2100, 300, 600)
    assert res["stratified"]
    # macro-F1 and top-1 agree with independent computations on the returned predictions.
    assert res["macro_f1"] == pytest.approx(f1_score(res["y_test"], res["y_pred"], average="macro"))
    assert res["top1"] == pytest.approx(np.mean(res["y_test"] == res["y_pred"]))
    assert res["chance_rate"] == pytest.approx(np.bincount(res["y_test"]).max() / 600)
    # Stratified: test-split group shares match the full data.
    np.testing.assert_allclose(np.bincount(res["y_test"], minlength=G) / 600, np.bincount(g, minlength=G) / 3000,
                               atol=0.01)


def test_probe_is_at_chance_on_shuffled_labels():
    x, g = _encoded(3000, seed=1)
    shuffled = np.random.default_rng(7).permutation(g)
    res = train_attribute_probe(x, shuffled, num_groups=G, seed=0)
    assert abs(res["top1"] - res["chance_rate"]) < 0.08
    assert res["macro_f1"] == pytest.approx(f1_score(res["y_test"], res["y_pred"], average="macro"))


def test_probe_is_deterministic_and_leaves_global_rng_alone():
    x, g = _encoded(600, seed=2)
    torch.manual_seed(99)
    before = torch.rand(3)
    torch.manual_seed(99)
    a = train_attribute_probe(x, g, num_groups=G, seed=5, epochs=3)
    after = torch.rand(3)
    b = train_attribute_probe(torch.from_numpy(x), torch.from_numpy(g), num_groups=G, seed=5, epochs=3)
    assert torch.equal(before, after)  # the global torch stream is not consumed
    np.testing.assert_array_equal(a["y_pred"], b["y_pred"])
    assert a["top1"] == b["top1"] and a["best_epoch"] == b["best_epoch"]
    c = train_attribute_probe(x, g, num_groups=G, seed=6, epochs=3)
    assert not np.array_equal(a["y_test"], c["y_test"]) or not np.array_equal(a["y_pred"], c["y_pred"])


def test_unknown_groups_are_excluded_and_bad_labels_rejected():
    x, g = _encoded(500, seed=3)
    g = g.copy()
    g[:100] = -1
    res = train_attribute_probe(x, g, num_groups=G, seed=0, epochs=1)
    assert res["n_train"] + res["n_val"] + res["n_test"] == 400
    assert (res["y_test"] >= 0).all()
    g[0] = G
    with pytest.raises(ValueError, match="outside 0..3"):
        train_attribute_probe(x, g, num_groups=G, seed=0)
    with pytest.raises(ValueError, match="labels for"):
        train_attribute_probe(x, g[:10], num_groups=G, seed=0)


def test_rare_group_falls_back_to_unstratified_split():
    x, g = _encoded(200, seed=4)
    g = np.where(g == 3, 2, g)
    g[0] = 3  # a single sample of group 3 cannot be stratified
    res = train_attribute_probe(x, g, num_groups=G, seed=0, epochs=1)
    assert not res["stratified"]
    assert res["n_train"] + res["n_val"] + res["n_test"] == 200
