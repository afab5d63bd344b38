"""LiRA and RMIA scores (attacks/membership_scores.py) against hand-computed cases and scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from resfl_lightning.attacks.membership_scores import (
    lira_offline,
    lira_online,
    logit_confidence,
    rmia_scores,
)


def _p(phi: float) -> float:
    """The true-label probability whose logit confidence is phi."""
    return 1.0 / (1.0 + math.exp(-phi))


def test_logit_confidence_is_log_odds():
    assert logit_confidence(np.array([0.5, 0.8]))[1] == pytest.approx(math.log(4.0))
    assert logit_confidence(np.array([0.5]))[0] == 0.0
    assert np.isfinite(logit_confidence(np.array([0.0, 1.0]))).all()


def test_lira_offline_by_hand():
    # references give phi = 0, 1, 2 to example 0 (mean 1, std 1) and phi = 4, 4, 4 to example 1 (spread floored)
    out = np.array([[_p(0.0), _p(4.0)], [_p(1.0), _p(4.0)], [_p(2.0), _p(4.0)]])
    target = np.array([_p(2.0), _p(3.0)])
    score = lira_offline(target, out)
    assert score[0] == pytest.approx(0.8413447460685429, rel=1e-9)  # Phi((2 - 1) / 1)
    assert score[1] == pytest.approx(0.0, abs=1e-12)  # far below a zero-spread reference
    # one std for all examples: the sample std of the six values (0, 1, 2, 4, 4, 4)
    std = np.std([0, 1, 2, 4, 4, 4], ddof=1)
    assert lira_offline(target, out, global_std=True)[0] == pytest.approx(0.5 + 0.5 * math.erf((1 / std) / 2 ** 0.5))


def test_lira_online_is_the_gaussian_log_likelihood_ratio():
    inn = np.array([[_p(3.0)], [_p(5.0)]])   # mean 4, std sqrt(2)
    out = np.array([[_p(0.0)], [_p(2.0)]])   # mean 1, std sqrt(2)
    phi = 2.5
    s = math.sqrt(2.0)
    by_hand = (-(phi - 4) ** 2 / (2 * s * s)) - (-(phi - 1) ** 2 / (2 * s * s))  # equal stds: the normaliser cancels
    assert lira_online(np.array([_p(phi)]), inn, out)[0] == pytest.approx(by_hand, rel=1e-9)
    assert by_hand == pytest.approx(0.0)  # midway between the two means: no evidence either way
    assert lira_online(np.array([_p(4.0)]), inn, out)[0] > 0 > lira_online(np.array([_p(1.0)]), inn, out)[0]


def test_rmia_pairwise_ratio_by_hand():
    # two candidates, three population samples, two reference models
    target = np.array([0.9, 0.3])
    reference = np.array([[0.6, 0.3], [0.4, 0.3]])          # p(x): 0.5, 0.3 -> ratios 1.8, 1.0
    pop_target = np.array([0.5, 0.2, 0.8])
    pop_reference = np.array([[0.5, 0.4, 0.4], [0.5, 0.4, 0.4]])  # p(z): 0.5, 0.4, 0.4 -> ratios 1.0, 0.5, 2.0
    assert rmia_scores(target, reference, pop_target, pop_reference).tolist() == [2 / 3, 2 / 3]
    # gamma = 2: 1.8 >= 2 x (1.0, 0.5, 2.0) only for z = 1; 1.0 >= 2 x 0.5 for z = 1 as well
    assert rmia_scores(target, reference, pop_target, pop_reference, gamma=2.0).tolist() == [1 / 3, 1 / 3]
    # offline correction a = 0.5: p(x) = (1.5 mean + 0.5) / 2
    off = rmia_scores(target, reference, pop_target, pop_reference, offline_a=0.5)
    px = (1.5 * np.array([0.5, 0.3]) + 0.5) / 2
    pz = (1.5 * np.array([0.5, 0.4, 0.4]) + 0.5) / 2
    expected = ((target / px)[:, None] >= (pop_target / pz)[None, :]).mean(axis=1)
    assert off.tolist() == pytest.approx(expected.tolist())


def test_scores_separate_an_overfit_models_members():
    """A target that is more confident on its members than references that never saw them: both scores rank the
    members above the non-members (AUC 1 on this clean case)."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    n = 200
    members = np.r_[np.ones(n // 2), np.zeros(n // 2)]
    out_ref = rng.uniform(0.4, 0.7, size=(8, n))
    target = np.where(members == 1, 0.99, out_ref.mean(axis=0))
    assert roc_auc_score(members, lira_offline(target, out_ref)) == pytest.approx(1.0)
    pop_t, pop_r = rng.uniform(0.4, 0.7, 50), rng.uniform(0.4, 0.7, size=(8, 50))
    assert roc_auc_score(members, rmia_scores(target, out_ref, pop_t, pop_r)) > 0.95
