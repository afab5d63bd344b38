"""PUFFLE's regulariser (losses/parity.py): the one-vs-rest demographic-parity gap of the predictions, against
hand-computed batches and fairlearn's demographic-parity difference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fairlearn.metrics import demographic_parity_difference

from resfl_lightning.losses.parity import (
    detection_parity_gap,
    parity_gap,
    person_scores,
    prediction_parity_gap,
)

torch.set_num_threads(1)

# softmax(log p) = p: the rows are the probabilities written out.
PROBS = [[0.8, 0.2], [0.4, 0.6], [0.9, 0.1], [0.7, 0.3], [0.3, 0.7], [0.1, 0.9], [0.5, 0.5]]
GROUPS = [0, 0, 1, 1, 1, 2, -1]


def logits_of(probs):
    return torch.tensor(probs, dtype=torch.float64).log().requires_grad_(True)


def test_gap_equals_the_hand_computed_one_vs_rest_maximum():
    """Masses p_ik at the predicted class: rows 0-5 give (.8,0) (0,.6) | (.9,0) (.7,0) (0,.7) | (0,.9); row 6 is
    of unknown group. z=0: (.4,.3) vs rest (1.6,1.6)/4 -> 0.1; z=1: (1.6,.7)/3 vs (.8,1.5)/3 -> 0.8/3; z=2: (0,.9)
    vs (2.4,1.3)/5 -> max(.48, .64) = 0.64."""
    logits = logits_of(PROBS)
    gap = prediction_parity_gap(logits, torch.tensor(GROUPS))
    assert gap.item() == pytest.approx(0.64, abs=1e-12)
    # Two groups (rows 0-4): P~(.|0) = (.4, .3), P~(.|1) = (1.6, .7)/3; both one-vs-rest gaps are 0.4 - 1.6/3.
    two = prediction_parity_gap(logits[:5], torch.tensor(GROUPS[:5]))
    assert two.item() == pytest.approx(2 / 15, abs=1e-12)


def test_gradient_is_finite_non_zero_and_skips_unknown_rows():
    logits = logits_of(PROBS)
    prediction_parity_gap(logits, torch.tensor(GROUPS)).backward()
    assert torch.isfinite(logits.grad).all()
    assert logits.grad[:6].abs().sum() > 0
    assert logits.grad[6].abs().sum() == 0  # group -1 takes no part
    # the maximum is at (k=1, z=2): row 0 predicts class 0, so its class-1 mass is 0 and it gets no gradient
    assert logits.grad[0].abs().sum() == 0


def test_a_group_without_a_complement_contributes_nothing():
    logits = logits_of(PROBS[:2])
    lone = prediction_parity_gap(logits, torch.tensor([1, 1]))
    assert lone.item() == 0.0 and lone.requires_grad
    unknown = prediction_parity_gap(logits, torch.tensor([-1, 0]))  # the only other row is of unknown group
    assert unknown.item() == 0.0
    with pytest.raises(ValueError, match="first dimension"):
        parity_gap(torch.zeros(3, 2), torch.zeros(2))


def test_saturated_binary_predictions_give_fairlearns_demographic_parity_difference():
    """With confident predictions p_ik -> 1 at the predicted class, P~(1|z) is group z's selection rate: for two
    groups the gap is fairlearn's demographic_parity_difference."""
    rng = np.random.default_rng(0)
    y_pred = rng.integers(0, 2, 200)
    groups = rng.integers(0, 2, 200)
    logits = torch.tensor(np.where(y_pred[:, None] == np.arange(2), 40.0, -40.0))
    gap = prediction_parity_gap(logits, torch.tensor(groups))
    expected = demographic_parity_difference(np.zeros(200), y_pred, sensitive_features=groups)
    assert gap.item() == pytest.approx(expected, abs=1e-12)


def test_person_scores_take_the_best_overlapping_prediction_of_the_persons_class():
    """Image 0: the person [0,0,10,10] overlaps anchor 0 (IoU 1) and anchor 1 (IoU 100/120), not anchor 2: its score
    is max(.6, .9). Image 1: the person at [20,20,30,30] is anchor 2's box (.1); the one at [50,50,60,60] overlaps
    nothing: 0."""
    one = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 12.0], [20.0, 20.0, 30.0, 30.0]])
    boxes = torch.stack([one, one])
    probs = torch.tensor([[0.6, 0.9, 0.95], [0.3, 0.2, 0.1]], dtype=torch.float64).unsqueeze(-1).requires_grad_(True)
    gt = torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0], [50.0, 50.0, 60.0, 60.0]])
    scores = person_scores(boxes, probs, gt, torch.tensor([0.0, 1.0, 1.0]), torch.zeros(3), iou_threshold=0.5)
    torch.testing.assert_close(scores, torch.tensor([0.9, 0.1, 0.0], dtype=torch.float64))
    groups = torch.tensor([0, 1, 1])
    # tau = .25: detected masses (.9, 0, 0): group 0 .9 vs group 1 0. tau = .05: (.9, .1, 0): .9 vs .05.
    assert detection_parity_gap(scores, groups, 0.05).item() == pytest.approx(0.85)
    gap = detection_parity_gap(scores, groups, 0.25)
    assert gap.item() == pytest.approx(0.9)
    gap.backward()
    expected = torch.zeros_like(probs)
    expected[0, 1, 0] = 1.0  # only the matched anchor's score of the detected person moves the gap
    torch.testing.assert_close(probs.grad, expected)
    empty = person_scores(boxes, probs, gt[:0], torch.zeros(0), torch.zeros(0), iou_threshold=0.5)
    assert empty.shape == (0,) and detection_parity_gap(empty, groups[:0], 0.25).item() == 0.0
