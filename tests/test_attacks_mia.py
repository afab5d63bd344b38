"""Membership inference: features, a real shadow-model attack on an overfit model, and ROC metrics by hand."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import roc_auc_score
from sklearn.neural_network import MLPClassifier

from resfl_lightning.attacks.mia import (
    classification_mia_features,
    detection_mia_features,
    evaluate_membership_attack,
    fit_membership_attack,
    membership_metrics_from_scores,
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
    assert res["tpr_at_fpr_1"] == res["tpr_at_fpr_5"] == res["tpr_at_fpr_10"] == pytest.approx(2 / 3)
    # AUC: of 12 member/non-member pairs, only (0.4 vs 0.7) is mis-ordered -> 11/12.
    assert res["auc"] == pytest.approx(11 / 12)
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
    expected = np.array([
        [2, 0.7, 0.9, 6.0, 0.5 * (1 / 10 + 1 / 4), 0.1, 1.5],
        [0, 0, 0, 0, 0, 2.0, -0.2],  # no detections: zeros, loss and margin still given
        [1, 0.3, 0.3, 1.0, 0.7, 0.5, 0.0],  # u_cls taken as given when present
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
    expected = np.array([[0.7, ent0, 4.0, 0.2, 0.36, 0.5], [0.5, np.log(2), 1.0, 0.5, 0.69, 0.0]])
    np.testing.assert_allclose(f, expected, rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="not probability vectors"):
        classification_mia_features(np.array([[0.7, 0.7]]), None, np.array([0.1]))
