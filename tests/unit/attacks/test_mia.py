"""Membership inference: features, a real shadow-model attack on an overfit model, thresholds chosen on shadow data
only, and ROC metrics by hand."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from sklearn.neural_network import MLPClassifier

from resfl_lightning.attacks.mia import (
    choose_threshold,
    classification_mia_features,
    detection_mia_features,
    evaluate_membership_attack,
    fit_membership_attack,
    membership_metrics_from_scores,
    thresholds_at_fpr,
    tpr_at_fpr,
)

N_CLASSES = 4
DIM = 8


def _pool(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian inputs with random labels: a model can only fit them by memorising."""
    return rng.normal(size=(n, DIM)), rng.integers(0, N_CLASSES, size=n)


def _memoriser(x: np.ndarray, y: np.ndarray, seed: int) -> MLPClassifier:
    model = MLPClassifier(hidden_layer_sizes=(256,), alpha=0.0, max_iter=500, tol=1e-7, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # memorising on purpose; the loss keeps falling
        return model.fit(x, y)


def _features(model: MLPClassifier, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    probs = model.predict_proba(x)
    losses = -np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, None))
    return classification_mia_features(probs, None, losses)


@pytest.fixture(scope="module")
def shadow_and_target():
    rng = np.random.default_rng(0)
    shadow_in, shadow_out = _pool(rng, 200), _pool(rng, 200)
    target_in, target_out = _pool(rng, 200), _pool(rng, 400)
    shadow = _memoriser(*shadow_in, seed=1)
    target = _memoriser(*target_in, seed=2)
    assert shadow.score(*shadow_in) > 0.95 and target.score(*target_in) > 0.95  # really memorised
    attack = fit_membership_attack(_features(shadow, *shadow_in), _features(shadow, *shadow_out), seed=0)
    return attack, target, target_in, target_out


def test_attack_detects_members_of_overfit_model(shadow_and_target):
    attack, target, target_in, target_out = shadow_and_target
    res = evaluate_membership_attack(attack, _features(target, *target_in), _features(target, *target_out), seed=0)
    assert res["success_rate"] > 0.7
    assert res["auc"] > 0.75
    assert res["n_members"] == 200 and res["n_nonmembers"] == 400 and res["n_balanced_per_class"] == 200
    assert res["tpr_at_fpr_1"] <= res["tpr_at_fpr_5"] <= res["tpr_at_fpr_10"]
    # AUC agrees with scikit-learn on the attack's own scores.
    x = np.concatenate([_features(target, *target_in), _features(target, *target_out)])
    scores = attack.predict_proba(x)[:, 1]
    assert res["auc"] == pytest.approx(roc_auc_score(np.r_[np.ones(200), np.zeros(400)], scores))


def test_attack_is_at_chance_on_unseen_pool(shadow_and_target):
    attack, target, _, _ = shadow_and_target
    rng = np.random.default_rng(123)
    fake_in, fake_out = _pool(rng, 600), _pool(rng, 600)  # neither set was used to train the target
    res = evaluate_membership_attack(attack, _features(target, *fake_in), _features(target, *fake_out), seed=0)
    assert abs(res["success_rate"] - 0.5) < 0.07
    assert abs(res["auc"] - 0.5) < 0.07


def test_roc_metrics_match_hand_computed_case():
    # Members 0.9, 0.8, 0.4; non-members 0.7, 0.3, 0.2, 0.1. Thresholds descending:
    # 0.9 -> (FPR 0, TPR 1/3); 0.8 -> (0, 2/3); 0.7 -> (1/4, 2/3); 0.4 -> (1/4, 1); ...
    members, nonmembers = np.array([0.9, 0.8, 0.4]), np.array([0.7, 0.3, 0.2, 0.1])
    labels, scores = np.r_[np.ones(3), np.zeros(4)], np.r_[members, nonmembers]
    assert tpr_at_fpr(labels, scores, 0.0) == pytest.approx(2 / 3)
    assert tpr_at_fpr(labels, scores, 0.10) == pytest.approx(2 / 3)
    assert tpr_at_fpr(labels, scores, 0.25) == pytest.approx(1.0)
    res = membership_metrics_from_scores(members, nonmembers, seed=0)
    # Thresholds read off these very non-members: the oracle upper bound, labelled as such.
    assert res["oracle_tpr_at_fpr_1"] == res["oracle_tpr_at_fpr_5"] == res["oracle_tpr_at_fpr_10"] == \
        pytest.approx(2 / 3)
    assert "tpr_at_fpr_1" not in res  # no thresholds from elsewhere were given
    # AUC: of 12 member/non-member pairs, only (0.4 vs 0.7) is mis-ordered -> 11/12.
    assert res["auc"] == pytest.approx(11 / 12)
    # Thresholds set elsewhere (shadow non-members): TPR = members above them, and the FPR they really give here.
    given = membership_metrics_from_scores(members, nonmembers, seed=0, fpr_thresholds={0.01: 0.75, 0.05: 0.5,
                                                                                        0.10: 0.2})
    assert (given["tpr_at_fpr_1"], given["fpr_at_threshold_1"]) == (pytest.approx(2 / 3), 0.0)
    assert (given["tpr_at_fpr_5"], given["fpr_at_threshold_5"]) == (pytest.approx(2 / 3), 0.25)
    assert (given["tpr_at_fpr_10"], given["fpr_at_threshold_10"]) == (1.0, 0.5)
    # Balanced subsample keeps 3 of 4 non-members; at 0.5 the members score TPR 2/3 and every non-member is
    # below 0.5 except 0.7, so TNR is 1 or 2/3 depending on which three are kept.
    assert res["success_rate"] in (pytest.approx(0.5 * (2 / 3 + 1.0)), pytest.approx(0.5 * (2 / 3 + 2 / 3)))


def test_balanced_subsample_is_seeded():
    rng = np.random.default_rng(5)
    m, n = rng.random(50), rng.random(500)
    a, b = membership_metrics_from_scores(m, n, seed=3), membership_metrics_from_scores(m, n, seed=3)
    assert a == b
    srs = {membership_metrics_from_scores(m, n, seed=s)["success_rate"] for s in range(10)}
    assert len(srs) > 1  # the larger side really is subsampled with the seed


def test_calibration_balances_unequal_shadow_sets():
    # Identical distributions, 1:4 class ratio: a balanced attack scores about 0.5, not the 0.2 prior.
    rng = np.random.default_rng(0)
    attack = fit_membership_attack(rng.normal(size=(100, 3)), rng.normal(size=(400, 3)), seed=0)
    p = attack.predict_proba(rng.normal(size=(1000, 3)))[:, 1]
    assert abs(p.mean() - 0.5) < 0.1


def test_detection_features_by_hand():
    preds = [
        {"scores": torch.tensor([0.9, 0.5]), "alpha0": torch.tensor([9.0, 3.0])},
        {"scores": torch.zeros(0), "alpha0": torch.zeros(0), "u_cls": torch.zeros(0)},
        {"scores": np.array([0.3]), "alpha0": np.array([1.0]), "u_cls": np.array([0.7])},
    ]
    f = detection_mia_features(preds, [0.1, 2.0, 0.5], np.array([1.5, -0.2, 0.0]))
    # Dirichlet variance of a detection: p (1 - p) / (alpha0 + 1) with p its score.
    var0 = 0.5 * (0.9 * 0.1 / 10 + 0.5 * 0.5 / 4)
    expected = np.array([
        [2, 0.7, 0.9, 6.0, 0.5 * (1 / 10 + 1 / 4), 0.1, 1.5, var0],
        [0, 0, 0, 0, 0, 2.0, -0.2, 0],  # no detections: zeros, loss and margin still given
        [1, 0.3, 0.3, 1.0, 0.7, 0.5, 0.0, 0.3 * 0.7 / 2],  # u_cls taken as given when present
    ])
    np.testing.assert_allclose(f, expected, rtol=1e-6)
    with pytest.raises(ValueError, match="per_image_losses"):
        detection_mia_features(preds, [0.1, 2.0], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"per_image_preds\[0\]: missing key 'alpha0'"):
        detection_mia_features([{"scores": [0.5]}], [0.0], [0.0])


def test_classification_features_by_hand():
    probs = np.array([[0.7, 0.2, 0.1], [0.5, 0.5, 0.0]])
    f = classification_mia_features(probs, np.array([4.0, 1.0]), np.array([0.36, 0.69]))
    ent0 = -(0.7 * np.log(0.7) + 0.2 * np.log(0.2) + 0.1 * np.log(0.1))
    expected = np.array([[0.7, ent0, 4.0, 0.2, 0.36, 0.5, 0.7 * 0.3 / 5], [0.5, np.log(2), 1.0, 0.5, 0.69, 0.0, 0.125]])
    np.testing.assert_allclose(f, expected, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="not probability vectors"):
        classification_mia_features(np.array([[0.7, 0.7]]), None, np.array([0.1]))


# --- thresholds come from shadow data only ------------------------------------------------------------------------
def test_threshold_depends_only_on_shadow_data(shadow_and_target):
    attack, target, target_in, target_out = shadow_and_target
    members = _features(target, *target_in)
    rng = np.random.default_rng(9)
    # Two very different target non-member sets: the model's own held-out pool, and rows it memorised (members
    # mislabelled as non-members), which score like members.
    a = evaluate_membership_attack(attack, members, _features(target, *target_out), seed=0)
    b = evaluate_membership_attack(attack, members, _features(target, *target_in)[rng.permutation(200)[:150]], seed=0)
    assert a["threshold"] == b["threshold"] == attack.threshold
    for p in (1, 5, 10):  # TPR at shadow-set thresholds: members scored against fixed thresholds
        assert a[f"tpr_at_fpr_{p}"] == b[f"tpr_at_fpr_{p}"]
        assert a[f"fpr_at_threshold_{p}"] < b[f"fpr_at_threshold_{p}"]  # the realised FPR is what moves
    # The oracle reads the ROC at the evaluated non-members, so it moves with them.
    assert a["oracle_tpr_at_fpr_10"] > b["oracle_tpr_at_fpr_10"]


def test_threshold_is_the_balanced_accuracy_optimum_on_shadow_validation(shadow_and_target):
    attack = shadow_and_target[0]
    y, s = attack.val_labels, attack.val_scores
    assert attack.split_sizes == {"fit": 280, "validation": 40, "test": 80}  # 70/10/20 of 400 shadow rows
    assert len(y) == 40 and set(np.unique(y)) == {0, 1}
    best = max(balanced_accuracy_score(y, s > t) for t in np.r_[-1.0, np.unique(s), 2.0])
    assert balanced_accuracy_score(y, s > attack.threshold) == pytest.approx(best)
    assert attack.threshold == choose_threshold(y, s)


def test_choose_threshold_by_hand():
    # members 0.9, 0.6, 0.35; non-members 0.4, 0.3, 0.1: best split is between 0.4 and 0.6 (BA 5/6), or between 0.3
    # and 0.35 (BA (1 + 2/3)/2 = 5/6): a tie, broken towards 0.5 -> midpoint 0.5 of 0.4 and 0.6.
    labels, scores = np.array([1, 1, 1, 0, 0, 0]), np.array([0.9, 0.6, 0.35, 0.4, 0.3, 0.1])
    assert choose_threshold(labels, scores) == pytest.approx(0.5)
    # A clean split between 0.4 and 0.45; shifted by +0.3 it moves with the scores (a transferred 0.5 would call
    # every shifted row a member: balanced accuracy 0.5 instead of 1).
    separable = np.array([0.9, 0.6, 0.45, 0.4, 0.3, 0.1])
    assert choose_threshold(labels, separable) == pytest.approx(0.425)
    assert choose_threshold(labels, separable + 0.3) == pytest.approx(0.725)


def test_thresholds_at_fpr_hold_the_rate_on_the_set_they_came_from():
    ns = np.arange(20) / 20  # 0.00 .. 0.95
    t = thresholds_at_fpr(ns)
    assert t == {0.01: 0.95, 0.05: 0.90, 0.10: 0.85}  # FPR 0, 1/20, 2/20
    scores = np.random.default_rng(0).random(333)
    for target, thr in thresholds_at_fpr(scores).items():
        assert np.mean(scores > thr) <= target
        assert np.mean(scores >= thr) > target  # the lowest such threshold: one step lower breaks the bound
