"""Update-aware AIA protocol pieces: seeded shadow-client group mixes from the reserve, applicability, scoring."""

from __future__ import annotations

import numpy as np
import pytest

from resfl_lightning.attacks.settings import UpdateAiaSettings
from resfl_lightning.attacks.update_aia import applicable, shadow_client_sets, update_attribute_inference


def _reserve(seed: int = 0):
    rng = np.random.default_rng(seed)
    reserve = np.sort(rng.choice(10_000, size=600, replace=False))
    groups = rng.choice([0, 1, 2, -1], size=600, p=[0.6, 0.25, 0.1, 0.05])
    return reserve, groups


def test_shadow_client_sets_are_seeded_reserve_only_and_cover_every_group():
    reserve, groups = _reserve()
    sets = shadow_client_sets(reserve, groups, num_groups=3, count=6, size=60, alpha=0.5, seed=4)
    again = shadow_client_sets(reserve, groups, num_groups=3, count=6, size=60, alpha=0.5, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(sets, again))
    other = shadow_client_sets(reserve, groups, num_groups=3, count=6, size=60, alpha=0.5, seed=5)
    assert not all(np.array_equal(a, b) for a, b in zip(sets, other))
    group_of = dict(zip(reserve.tolist(), groups.tolist()))
    for k, items in enumerate(sets):
        assert np.isin(items, reserve).all() and len(np.unique(items)) == len(items) <= 60
        counts = np.bincount([group_of[i] for i in items], minlength=3)
        assert counts.argmax() == k % 3  # the mix's largest share is moved onto group k mod G
        assert -1 not in {group_of[i] for i in items}  # items without a known group are never drawn


def test_applicability():
    assert not applicable({0: 0, 1: 0, 2: 0, 3: 0})  # IID shards: one dominant group, nothing to infer
    assert applicable({0: 0, 1: 2, 2: 0, 3: 0})


def test_update_attribute_inference_scores_real_updates_with_a_shadow_trained_probe():
    rng = np.random.default_rng(0)
    directions = rng.normal(size=(3, 12))

    def updates(labels):
        return np.stack([directions[g] + 0.3 * rng.normal(size=12) for g in labels]).astype(np.float32)

    shadow_y = np.arange(300) % 3
    real_y = np.array([0, 1, 2, 0, 0, 1] * 5)
    res = update_attribute_inference(updates(shadow_y), shadow_y, updates(real_y), real_y, 3, seed=0,
                                     settings=UpdateAiaSettings(), is_applicable=True)
    m = res["metrics"]
    assert m["attack/update_aia_applicable"] == 1.0 and m["attack/update_aia_balanced_accuracy"] > 0.9
    assert m["attack/update_aia_success_rate"] == m["attack/update_aia_balanced_accuracy"]
    assert m["attack/update_aia_chance_majority"] == pytest.approx(0.5)
    assert m["attack/update_aia_chance_uniform"] == pytest.approx(1 / 3)
    assert res["probe"]["n_test"] == 30 and res["probe"]["n_train"] + res["probe"]["n_val"] == 300
    not_applicable = update_attribute_inference(updates(shadow_y), shadow_y, updates(real_y), real_y, 3, seed=0,
                                                settings=UpdateAiaSettings(), is_applicable=False)["metrics"]
    assert not_applicable["attack/update_aia_applicable"] == 0.0
    assert np.isnan(not_applicable["attack/update_aia_balanced_accuracy"])
