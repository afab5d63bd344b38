"""metrics.min_group_size (metrics/group_size.py): which groups are too small, and that marking them unknown leaves them
out of every group metric; the kept groups' values against fairlearn's MetricFrame, detection by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fairlearn.metrics import (
    MetricFrame,
    demographic_parity_ratio,
    false_positive_rate,
    selection_rate,
    true_positive_rate,
)

from resfl_lightning.metrics.eod import classification_eod, detection_eod
from resfl_lightning.metrics.fairness import classification_fairness, detection_fairness
from resfl_lightning.metrics.group_size import small_groups, without_groups
from tests.unit.metrics.test_fairness import gt, pred


def test_small_groups_counts_known_units_and_one_keeps_every_group():
    s = np.array([0] * 40 + [1] * 12 + [2] * 30 + [-1] * 5)
    assert small_groups(s, 30) == {1: 12}
    assert small_groups(torch.as_tensor(s), 31) == {1: 12, 2: 30}
    assert small_groups(s, 1) == {} and small_groups(s, 0) == {}
    masked = without_groups(torch.as_tensor(s), {1: 12})
    assert masked.dtype == torch.int64 and (masked == -1).sum() == 12 + 5 and (masked == 1).sum() == 0
    assert without_groups(s, {}) is s
    assert np.array_equal(without_groups(s, {2: 30}), np.where(s == 2, -1, s))


def rows_with_a_tiny_group(seed: int):
    """Groups 0 and 2 of 300 rows, group 1 of 12 rows that the classifier never selects."""
    rng = np.random.default_rng(seed)
    s = rng.permutation(np.array([0] * 300 + [1] * 12 + [2] * 300))
    y_true = rng.integers(0, 2, s.size)
    y_pred = (rng.random(s.size) < np.array([0.4, -1.0, 0.6])[s] + 0.2 * y_true).astype(int)
    return y_true, y_pred, s


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classification_metrics_on_the_kept_groups_match_fairlearn(seed):
    y_true, y_pred, s = rows_with_a_tiny_group(seed)
    excluded = small_groups(s, 30)
    assert excluded == {1: 12}
    out = classification_fairness(y_true, y_pred, without_groups(s, excluded))

    kept = s != 1
    frame = MetricFrame(metrics={"sr": selection_rate, "tpr": true_positive_rate, "fpr": false_positive_rate},
                        y_true=y_true[kept], y_pred=y_pred[kept], sensitive_features=s[kept])
    for g in (0, 2):
        for key, col in (("selection_rate", "sr"), ("tpr", "tpr"), ("fpr", "fpr")):
            assert out[f"{key}/{g}"] == pytest.approx(frame.by_group.loc[g, col])
    assert not any(k.endswith("/1") for k in out)  # no per-group number of the left-out group
    di = demographic_parity_ratio(y_true[kept], y_pred[kept], sensitive_features=s[kept])
    assert out["abs_one_minus_di"] == pytest.approx(1 - di)
    tpr = frame.by_group["tpr"]
    assert out["delta_eop"] == pytest.approx(tpr.max() - tpr.min())
    assert out["accuracy"] == pytest.approx((y_true == y_pred).mean())  # utility still counts every row

    # Without the exclusion the 12-row group (never selected) drives DI to 0: the rule is what changes the value.
    every = classification_fairness(y_true, y_pred, s)
    assert every["abs_one_minus_di"] == 1.0 and out["abs_one_minus_di"] < 0.9


def test_eod_pools_only_the_kept_groups_as_fairlearn_rates_them():
    y_true, y_pred, s = rows_with_a_tiny_group(4)
    s = np.where((s == 2) & (np.arange(s.size) % 2 == 0), 3, s)  # a fourth group, pooled with 2 on the other side
    masked = without_groups(s, small_groups(s, 30))
    out = classification_eod(y_true, y_pred, masked, num_groups=4, protected_group=0)
    kept = s != 1
    side = np.where(s[kept] == 0, "p", "u")
    by = MetricFrame(metrics={"tpr": true_positive_rate, "fpr": false_positive_rate}, y_true=y_true[kept],
                     y_pred=y_pred[kept], sensitive_features=side).by_group
    assert out["tpr_unprotected"] == pytest.approx(by.loc["u", "tpr"])
    assert out["fpr_unprotected"] == pytest.approx(by.loc["u", "fpr"])
    assert out["eod"] == pytest.approx(abs(by.loc["p", "tpr"] - by.loc["u", "tpr"])
                                       + abs(by.loc["p", "fpr"] - by.loc["u", "fpr"]))
    with pytest.raises(ValueError, match="protected group"):  # a left-out protected group has no rate
        classification_eod(y_true, y_pred, masked, num_groups=4, protected_group=1)


def test_detection_left_out_persons_still_take_their_detections_but_count_for_no_group():
    """Group 2 has one person (< 2), detected: its detection stays matched to it (no false positive appears), and TPR,
    DI, delta-EOP and EOD read groups 0 and 1 only."""
    box = [[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]]
    pairs = [(pred(box, [0.9, 0.8, 0.7]), gt(box, [0, 1, 2])), (pred([], []), gt(box[:2], [0, 1]))]
    groups = torch.cat([g["groups"] for _, g in pairs])
    excluded = small_groups(groups, 2)
    assert excluded == {2: 1}
    measured = [(p, {**g, "groups": without_groups(g["groups"], excluded)}) for p, g in pairs]
    out = detection_fairness(measured, num_groups=3)
    assert out["tpr/0"] == out["tpr/1"] == 0.5 and "tpr/2" not in out
    assert out["abs_one_minus_di"] == 0.0 and out["delta_eop"] == 0.0
    every = detection_fairness(pairs, num_groups=3)
    assert every["tpr/2"] == 1.0 and every["abs_one_minus_di"] == every["delta_eop"] == 0.5
    eod = detection_eod(measured, num_groups=3, protected_group=1)
    assert eod["tpr_unprotected"] == 0.5 and eod["fpr_unprotected"] == 0.0  # group 2's detection is no false positive
