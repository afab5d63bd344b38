"""Group TPR / DI / Delta-EOP / scores on a hand-computed detection case; classification metrics vs fairlearn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fairlearn.metrics import (
    MetricFrame,
    demographic_parity_ratio,
    equal_opportunity_difference,
    equalized_odds_difference,
    false_positive_rate,
    selection_rate,
    true_positive_rate,
    true_positive_rate_difference,
)
from sklearn.metrics import accuracy_score

from resfl_lightning.metrics import fairness as F


def boxes(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).reshape(-1, 4)


def pred(rows, scores, labels=None):
    n = len(scores)
    lab = torch.zeros(n, dtype=torch.long) if labels is None else torch.tensor(labels)
    return {"boxes": boxes(*rows), "scores": torch.tensor(scores, dtype=torch.float32).reshape(-1), "labels": lab}


def gt(rows, groups):
    return {"boxes": boxes(*rows), "labels": torch.zeros(len(groups), dtype=torch.long), "groups": torch.tensor(groups)}


def hand_case():
    """Five images, groups 0 and 1 (+ unknown persons). Expected: g0 TP 2 FN 1, g1 TP 1 FN 3."""
    return [
        # a (g0) detected; c (unknown) detected, not counted; b (g1) only by a score .2 < .25 detection -> FN.
        (
            pred([[0, 0, 10, 10], [40, 0, 50, 10], [20, 0, 30, 10]], [0.9, 0.8, 0.2]),
            gt([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], [0, 1, -1]),
        ),
        # d (g0) hit by two detections -> one TP; e (g1) hit only by a wrong-class detection -> FN.
        (
            pred([[0, 0, 10, 10], [0, 0, 10, 10], [100, 100, 120, 120]], [0.95, 0.6, 0.9], [0, 0, 1]),
            gt([[0, 0, 10, 10], [100, 100, 120, 120]], [0, 1]),
        ),
        # f (g1) detected; h (g0) missed.
        (pred([[0, 0, 10, 10]], [0.5]), gt([[0, 0, 10, 10], [30, 30, 40, 40]], [1, 0])),
        # No persons, only false positives: contributes nothing.
        (pred([[0, 0, 5, 5]], [0.99]), gt([], [])),
        # g1 person, no detections -> FN.
        (pred([], []), gt([[0, 0, 10, 10]], [1])),
    ]


def test_group_counts_and_scores_hand_computed():
    tp, fn = F.group_counts(hand_case(), num_groups=3, score_threshold=0.25)
    assert tp.tolist() == [2, 1, 0] and fn.tolist() == [1, 3, 0]
    tpr = F.group_tpr(tp, fn)
    assert tpr[0].item() == pytest.approx(2 / 3) and tpr[1].item() == pytest.approx(1 / 4) and math.isnan(tpr[2])
    # DI = (1/4)/(2/3) = 3/8; |1-DI| = 5/8; Delta-EOP = 2/3 - 1/4 = 5/12; score = (5/8 + 5/12)/2 = 25/48.
    assert F.disparate_impact(tpr) == pytest.approx(3 / 8)
    assert F.abs_one_minus_di(tpr) == pytest.approx(5 / 8)
    assert F.equal_opportunity_difference(tpr) == pytest.approx(5 / 12)
    assert F.fairness_score(3 / 8, 5 / 12) == pytest.approx(25 / 48)
    summary = F.detection_fairness(hand_case(), num_groups=3)
    assert summary == pytest.approx(
        {
            "tpr/0": 2 / 3,
            "tpr/1": 1 / 4,
            "di": 3 / 8,
            "abs_one_minus_di": 5 / 8,
            "delta_eop": 5 / 12,
            "fairness_score": 25 / 48,
        }
    )
    # Lowering the score threshold lets the .2 detection count: g1 TP 2, FN 2.
    tp, fn = F.group_counts(hand_case(), num_groups=3, score_threshold=0.0)
    assert tp.tolist() == [2, 2, 0] and fn.tolist() == [1, 2, 0]


def test_tpr_never_exceeds_one_on_random_cases():
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        pairs = []
        for _ in range(5):
            m, n = int(torch.randint(0, 6, (1,), generator=gen)), int(torch.randint(0, 15, (1,), generator=gen))
            g = torch.rand(m, 2, generator=gen) * 50
            gb = torch.cat([g, g + 10], 1)
            # Many detections piled onto the same persons: a pooled or non-one-to-one matcher would exceed TPR 1.
            src = gb[torch.randint(0, max(m, 1), (n,), generator=gen)] if m else torch.rand(n, 4, generator=gen)
            pb = src + torch.randn(n, 4, generator=gen)
            pairs.append(
                (
                    {"boxes": pb, "scores": torch.rand(n, generator=gen), "labels": torch.zeros(n, dtype=torch.long)},
                    {
                        "boxes": gb,
                        "labels": torch.zeros(m, dtype=torch.long),
                        "groups": torch.randint(-1, 3, (m,), generator=gen),
                    },
                )
            )
        tp, fn = F.group_counts(pairs, num_groups=3, score_threshold=0.0)
        n_persons = torch.cat([p[1]["groups"] for p in pairs])
        assert (tp + fn).tolist() == [int((n_persons == g).sum()) for g in range(3)]
        tpr = F.group_tpr(tp, fn)
        assert ((tpr <= 1) | tpr.isnan()).all() and ((tpr >= 0) | tpr.isnan()).all()


def test_rate_helpers_edge_cases_and_errors():
    assert math.isnan(F.disparate_impact([0.0, 0.0]))  # 0/0
    assert F.disparate_impact([0.4, math.nan]) == 1.0
    assert F.eo_gap([0.2, 0.9, 0.5]) == pytest.approx(0.7) and F.eo_gap([0.3]) == 0.0
    assert F.equalized_odds_difference(0.8, 0.6, 0.1, 0.25) == pytest.approx(0.35)
    assert F.privacy_score(0.6, 0.3) == pytest.approx(0.45)
    with pytest.raises(ValueError, match="no group"):
        F.disparate_impact([math.nan])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        F.equal_opportunity_difference([0.5, 1.5])
    with pytest.raises(ValueError, match="fpr_u"):
        F.equalized_odds_difference(0.5, 0.5, 0.5, 2.0)
    with pytest.raises(ValueError, match="image 1"):
        F.group_counts([hand_case()[0], (pred([], []), gt([[0, 0, 1, 1]], [5]))], num_groups=3)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_classification_fairness_matches_fairlearn(seed):
    rng = np.random.default_rng(seed)
    n = 600
    s = rng.integers(0, 3, n)
    y_true = rng.integers(0, 2, n)
    # Group-dependent predictions so the gaps are not trivially zero.
    y_pred = (rng.random(n) < np.array([0.3, 0.5, 0.7])[s] + 0.2 * y_true).astype(int)
    out = F.classification_fairness(y_true, y_pred, s)

    assert out["accuracy"] == pytest.approx(accuracy_score(y_true, y_pred))
    mf = MetricFrame(
        metrics={"sr": selection_rate, "tpr": true_positive_rate, "fpr": false_positive_rate},
        y_true=y_true,
        y_pred=y_pred,
        sensitive_features=s,
    )
    for g in range(3):
        assert out[f"selection_rate/{g}"] == pytest.approx(mf.by_group.loc[g, "sr"])
        assert out[f"tpr/{g}"] == pytest.approx(mf.by_group.loc[g, "tpr"])
        assert out[f"fpr/{g}"] == pytest.approx(mf.by_group.loc[g, "fpr"])
    assert out["di"] == pytest.approx(demographic_parity_ratio(y_true, y_pred, sensitive_features=s))
    assert out["abs_one_minus_di"] == pytest.approx(1 - demographic_parity_ratio(y_true, y_pred, sensitive_features=s))
    assert out["delta_eop"] == pytest.approx(equal_opportunity_difference(y_true, y_pred, sensitive_features=s))
    assert out["eo_gap"] == pytest.approx(true_positive_rate_difference(y_true, y_pred, sensitive_features=s))
    assert out["fairness_score"] == pytest.approx((out["abs_one_minus_di"] + out["delta_eop"]) / 2)

    # EOD between two groups (protected 0, unprotected 1) from fairlearn's per-group rates; fairlearn's own
    # equalized_odds_difference is max(|dTPR|, |dFPR|), which bounds ours (the sum) from below.
    two = s < 2
    eod = F.equalized_odds_difference(out["tpr/0"], out["tpr/1"], out["fpr/0"], out["fpr/1"])
    by = mf.by_group
    assert eod == pytest.approx(abs(by.loc[0, "tpr"] - by.loc[1, "tpr"]) + abs(by.loc[0, "fpr"] - by.loc[1, "fpr"]))
    fl_max = equalized_odds_difference(y_true[two], y_pred[two], sensitive_features=s[two])
    assert fl_max <= eod + 1e-12 and eod <= 2 * fl_max + 1e-12


def test_classification_unknown_group_and_errors():
    y_true = np.array([1, 1, 0, 1, 0, 1])
    y_pred = np.array([1, 0, 0, 1, 1, 0])
    s = np.array([0, 0, 0, 1, 1, -1])
    out = F.classification_fairness(y_true, y_pred, s)
    assert out["accuracy"] == pytest.approx(3 / 6)  # all samples, the unknown one included
    assert out["tpr/0"] == pytest.approx(1 / 2) and out["tpr/1"] == 1.0 and "tpr/-1" not in out
    assert out["selection_rate/0"] == pytest.approx(1 / 3) and out["selection_rate/1"] == 1.0
    with pytest.raises(ValueError, match="y_pred must be binary"):
        F.classification_fairness(y_true, y_pred * 2, s)
    with pytest.raises(ValueError, match="lengths differ"):
        F.classification_fairness(y_true, y_pred[:-1], s)
