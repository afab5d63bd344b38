"""Kamiran–Calders reweighing (data/reweighing.py): a hand-computed case, the factorisation it exists for, the missing
cell and unknown-group rules, and the per-split weights over the row index space."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resfl_lightning.data.reweighing import kamiran_calders_weights, split_row_weights

torch.set_num_threads(1)


def weighted_joint(groups: torch.Tensor, labels: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Weighted P(a, y) table, counted cell by cell (independent of the module's bincount)."""
    table = torch.zeros(int(groups.max()) + 1, int(labels.max()) + 1, dtype=torch.float64)
    for a, y, wi in zip(groups.tolist(), labels.tolist(), w.tolist()):
        table[a, y] += wi
    return table / table.sum()


def test_hand_computed_case():
    # n = 8: P(a=0) = 3/8, P(a=1) = 5/8, P(y=1) = P(y=0) = 1/2; joint (0,1) 1/8, (0,0) 2/8, (1,1) 3/8, (1,0) 2/8.
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    labels = torch.tensor([1, 0, 0, 1, 1, 1, 0, 0])
    w = kamiran_calders_weights(groups, labels)
    expected = torch.tensor([3 / 2, 3 / 4, 3 / 4, 5 / 6, 5 / 6, 5 / 6, 5 / 4, 5 / 4], dtype=torch.float64)
    torch.testing.assert_close(w, expected)
    assert float(w.sum()) == pytest.approx(8.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_joint_factorises_and_keeps_the_marginals(seed):
    """The defining property: under w, P(a, y) = P(a) P(y), with P(a) and P(y) the unweighted marginals; Σ w = n."""
    g = torch.Generator().manual_seed(seed)
    groups = torch.randint(0, 3, (500,), generator=g)
    labels = (torch.rand(500, generator=g) < 0.2 + 0.25 * groups).long() + (torch.rand(500, generator=g) < 0.1)
    w = kamiran_calders_weights(groups, labels)
    plain = weighted_joint(groups, labels, torch.ones(500, dtype=torch.float64))
    assert (plain > 0).all()  # every cell present: the plain KC weights, no rescale
    p_a, p_y = plain.sum(1, keepdim=True), plain.sum(0, keepdim=True)
    assert not torch.allclose(plain, p_a * p_y, atol=1e-3)  # the data are dependent to begin with
    torch.testing.assert_close(weighted_joint(groups, labels, w), p_a * p_y)
    assert float(w.sum()) == pytest.approx(500.0)


def test_a_group_without_positives_gets_no_mass_there_and_the_rest_is_rescaled():
    """Group 0 holds no positive: the present cells get KC's weights, rescaled by 9/8 so Σ w = n; the weighted joint
    is proportional to P(a) P(y) on the cells present."""
    groups = torch.tensor([0, 0, 1, 1, 1, 1])
    labels = torch.tensor([0, 0, 1, 0, 1, 0])
    w = kamiran_calders_weights(groups, labels)
    # raw (0,0) = (1/3)(2/3)/(1/3) = 2/3, (1,1) = (2/3)(1/3)/(1/3) = 2/3, (1,0) = (2/3)(2/3)/(1/3) = 4/3; sum 16/3.
    torch.testing.assert_close(w, torch.tensor([3 / 4, 3 / 4, 3 / 4, 3 / 2, 3 / 4, 3 / 2], dtype=torch.float64))
    joint = weighted_joint(groups, labels, w)
    assert float(joint[0, 1]) == 0.0
    torch.testing.assert_close(joint[joint > 0], torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64))


def test_one_label_only_and_unknown_groups_weigh_one():
    groups, labels = torch.tensor([0, 1, 1, 2]), torch.zeros(4, dtype=torch.long)
    assert kamiran_calders_weights(groups, labels).tolist() == [1.0] * 4
    # Unknown-group rows weigh 1 and leave the known rows' weights as the known rows alone give them.
    groups = torch.tensor([0, 0, 0, -1, 1, 1, 1, 1, 1, -1])
    labels = torch.tensor([1, 0, 0, 1, 1, 1, 1, 0, 0, 0])
    w = kamiran_calders_weights(groups, labels)
    known = groups >= 0
    assert w[~known].tolist() == [1.0, 1.0]
    torch.testing.assert_close(w[known], kamiran_calders_weights(groups[known], labels[known]))
    assert kamiran_calders_weights(torch.full((3,), -1), torch.tensor([0, 1, 1])).tolist() == [1.0] * 3


def test_split_row_weights_weigh_each_split_on_its_own_rows():
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1])
    labels = torch.tensor([1, 0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0])
    splits = [np.arange(8), np.array([8, 9, 10])]  # rows 11 in no split
    w = split_row_weights(groups, labels, splits)
    assert w.dtype == torch.float32 and w.shape == (12,)
    torch.testing.assert_close(w[:8], kamiran_calders_weights(groups[:8], labels[:8]).float())
    torch.testing.assert_close(w[8:11], kamiran_calders_weights(groups[8:11], labels[8:11]).float())
    assert float(w[11]) == 1.0
    with pytest.raises(ValueError, match="two splits"):
        split_row_weights(groups, labels, [np.arange(5), np.arange(4, 8)])
