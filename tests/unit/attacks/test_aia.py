"""Attribute inference probe: learns an encoded group, scores by balanced accuracy (a 10 % minority counts), stays at
chance on shuffled labels, deterministic, and a train/test variant that never sees its test rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score

from resfl_lightning.attacks.aia import (
    aia_success_rate,
    probe_scores,
    train_attribute_probe,
    train_test_attribute_probe,
)
from resfl_lightning.metrics.fairness import privacy_score

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
    assert aia_success_rate(res) == res["balanced_accuracy"] == pytest.approx(
        balanced_accuracy_score(res["y_test"], res["y_pred"]))
    assert res["n_train"] + res["n_val"] + res["n_test"] == 3000
    assert (res["n_train"], res["n_val"], res["n_test"]) == (2100, 300, 600)
    assert res["stratified"]
    # macro-F1 and top-1 agree with independent computations on the returned predictions.
    assert res["macro_f1"] == pytest.approx(f1_score(res["y_test"], res["y_pred"], average="macro"))
    assert res["top1"] == pytest.approx(np.mean(res["y_test"] == res["y_pred"]))
    assert res["chance_majority"] == pytest.approx(np.bincount(res["y_test"]).max() / 600)
    assert res["chance_uniform"] == 1 / G
    # Stratified: test-split group shares match the full data.
    np.testing.assert_allclose(np.bincount(res["y_test"], minlength=G) / 600, np.bincount(g, minlength=G) / 3000,
                               atol=0.01)


def test_probe_is_at_chance_on_shuffled_labels():
    x, g = _encoded(3000, seed=1)
    shuffled = np.random.default_rng(7).permutation(g)
    res = train_attribute_probe(x, shuffled, num_groups=G, seed=0)
    assert abs(res["balanced_accuracy"] - res["chance_uniform"]) < 0.08
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


# --- balanced accuracy: a minority group counts as much as the majority -------------------------------------------
def _minority(n: int, seed: int, informative: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """10 % of rows are group 1; column 0 flags them perfectly (or carries nothing when not informative)."""
    rng = np.random.default_rng(seed)
    groups = (np.arange(n) % 10 == 0).astype(np.int64)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    if informative:
        x[:, 0] = 5.0 * groups
    return x, groups


def test_probe_on_a_perfectly_encoded_10_percent_minority():
    x, g = _minority(2000, seed=0)
    res = train_attribute_probe(x, g, num_groups=2, seed=0)
    assert res["chance_majority"] == pytest.approx(0.9)  # top-1 a majority guess already gets
    assert res["chance_uniform"] == 0.5  # balanced accuracy a majority guess gets
    assert res["balanced_accuracy"] > 0.98 and res["top1"] > 0.98
    assert res["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(res["y_test"], res["y_pred"]))
    majority = probe_scores(res["y_test"], np.zeros_like(res["y_test"]), num_groups=2)
    assert majority["top1"] == pytest.approx(0.9) and majority["balanced_accuracy"] == 0.5
    # The Privacy Score's AIA term is the balanced accuracy: the majority guess no longer looks like a 0.9 attack.
    assert privacy_score(0.5, aia_success_rate(majority)) == 0.5
    assert privacy_score(0.5, aia_success_rate(res)) > 0.74


def test_probe_on_an_uninformative_10_percent_minority_is_at_balanced_chance():
    x, g = _minority(2000, seed=1, informative=False)
    res = train_attribute_probe(x, g, num_groups=2, seed=0)
    assert abs(res["balanced_accuracy"] - 0.5) < 0.08  # class-balanced training: no free 0.9 from the majority


def test_probe_scores_hand_computed():
    y_true = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    y_pred = np.array([0, 0, 1, 0, 1, 0, 2, 1])
    s = probe_scores(y_true, y_pred, num_groups=4)  # group 3 never occurs
    assert s["balanced_accuracy"] == pytest.approx((3 / 4 + 1 / 2 + 1 / 2) / 3)
    assert s["top1"] == pytest.approx(5 / 8)
    assert s["macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro"))
    assert s["chance_uniform"] == pytest.approx(1 / 3) and s["chance_majority"] == pytest.approx(0.5)


def test_train_test_probe_never_uses_its_test_rows():
    x, g = _encoded(1200, seed=5)
    x_test, g_test = _encoded(300, seed=6)
    a = train_test_attribute_probe(x, g, x_test, g_test, num_groups=G, seed=0)
    assert a["balanced_accuracy"] > 0.9 and a["n_test"] == 300 and a["n_train"] + a["n_val"] == 1200
    # Test labels only score: shuffling them leaves every prediction unchanged.
    b = train_test_attribute_probe(x, g, x_test, np.random.default_rng(1).permutation(g_test), num_groups=G, seed=0)
    np.testing.assert_array_equal(a["y_pred"], b["y_pred"])
    # Test features only get predicted: wrecking half of them changes no prediction on the other half.
    wrecked = x_test.copy()
    wrecked[:150] = 1e3
    c = train_test_attribute_probe(x, g, wrecked, g_test, num_groups=G, seed=0)
    np.testing.assert_array_equal(a["y_pred"][150:], c["y_pred"][150:])
