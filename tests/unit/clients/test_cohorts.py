"""UFM cohort selection: true / partial / noisy groups and the label-free variants (docs/method.md §3)."""

from __future__ import annotations

import math

import pytest
import torch

from resfl_lightning.clients.base import UfmSettings
from resfl_lightning.clients.cohorts import effective_mode, person_vacuity, ufm_cohorts
from resfl_lightning.metrics.ufm import ufm_from_detections


def two_images():
    """Image 0: one person (group 0) detected with alpha0=4; image 1: two persons (groups 1, 2), one detected."""
    preds = [
        {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0]]), "scores": torch.tensor([0.9]), "labels": torch.tensor([0]),
         "alpha0": torch.tensor([4.0])},
        {"boxes": torch.tensor([[20.0, 20.0, 30.0, 30.0]]), "scores": torch.tensor([0.8]),
         "labels": torch.tensor([0]), "alpha0": torch.tensor([10.0])},
    ]
    gts = [
        {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0]]), "labels": torch.tensor([0]), "groups": torch.tensor([0]),
         "proxy": torch.tensor([1])},
        {"boxes": torch.tensor([[20.0, 20.0, 30.0, 30.0], [40.0, 40.0, 50.0, 50.0]]), "labels": torch.tensor([0, 0]),
         "groups": torch.tensor([1, 2]), "proxy": torch.tensor([0, -1])},
    ]
    return preds, gts


def test_true_groups_unchanged_and_p1_falls_back_to_cluster():
    preds, gts = two_images()
    assert ufm_cohorts(preds, gts, UfmSettings(), 3, seed=0) is None
    assert effective_mode(UfmSettings(drop_fraction=1.0)) == "cluster"
    with pytest.raises(ValueError, match="features"):
        ufm_cohorts(preds, gts, UfmSettings(drop_fraction=1.0), 3, seed=0)
    feats = [torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0], [0.05, 1.0]])]
    cohorts = ufm_cohorts(preds, gts, UfmSettings(drop_fraction=1.0, num_cohorts=2), 3, seed=0, features=feats)
    assert cohorts[0].tolist() != [cohorts[1][0].item()] and cohorts[1][0] == cohorts[1][1]


def test_vacuity_and_slices_hand_computed():
    preds, gts = two_images()
    vac = person_vacuity(preds, gts, UfmSettings())
    assert vac.tolist()[:2] == [0.25, 0.1] and math.isinf(vac[2])
    cohorts = ufm_cohorts(preds, gts, UfmSettings(cohorts="slices", num_cohorts=3), 3, seed=0)
    # Ranks by vacuity: person (img1, #0) 0.1 -> 0, (img0) 0.25 -> 1, the missed one inf -> 2.
    assert cohorts[0].tolist() == [1] and cohorts[1].tolist() == [0, 2]
    res = ufm_from_detections(list(zip(preds, gts)), cohorts=cohorts)
    # abar: cohort0 = 10, cohort1 = 4, cohort2 = 0 -> floored 1e-3.
    inv = [1 / 10, 1 / 4, 1 / 1e-3]
    assert res.ufm == pytest.approx((max(inv) - min(inv)) / (sum(inv) / 3 + 1e-6))


def test_proxy_and_partial_noisy_labels():
    preds, gts = two_images()
    proxy = ufm_cohorts(preds, gts, UfmSettings(cohorts="proxy"), 3, seed=0)
    assert proxy[0].tolist() == [1] and proxy[1].tolist() == [0, -1]
    dropped = ufm_cohorts(preds, gts, UfmSettings(drop_fraction=2 / 3), 3, seed=0)
    assert int((torch.cat(dropped) == -1).sum()) == 2
    flipped = ufm_cohorts(preds, gts, UfmSettings(flip_rate=1.0), 3, seed=0)
    assert all(a != b for a, b in zip(torch.cat(flipped).tolist(), [0, 1, 2]))
    with pytest.raises(ValueError, match="ufm.cohorts"):
        UfmSettings(cohorts="age")
