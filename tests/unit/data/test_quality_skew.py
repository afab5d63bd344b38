"""The quality_skew scenario touches only the skewed clients' target-group persons, and only as documented."""

from __future__ import annotations

import numpy as np
import pytest

from resfl_lightning.data.federated import build_federated_data
from resfl_lightning.data.quality_skew import QualitySkewSettings, apply_quality_skew, skewed_clients
from tests.helpers import compose_config


@pytest.fixture(scope="module")
def base():
    cfg = compose_config("dataset.num_images=120", "dataset.image_size=64")
    return build_federated_data(cfg.dataset, seed=0, rank_zero=False)


def test_only_skewed_clients_target_group_changes(base):
    data, summary = apply_quality_skew(base, QualitySkewSettings(client_fraction=0.5, dim=0.5, missing_rate=0.5),
                                       seed=3)
    ann0, ann1 = base.source.annotations, data.source.annotations
    g = summary["group"]
    counts = np.bincount(ann0.groups[ann0.groups >= 0], minlength=base.num_groups)
    assert counts[g] == counts.min()  # the minority by default
    skew = summary["clients"]
    assert skew == skewed_clients(base.num_clients, 0.5, 3) and len(skew) == base.num_clients // 2
    skew_train = np.concatenate([base.splits.clients[c].train for c in skew])
    skew_all = np.concatenate([np.concatenate([base.splits.clients[c].train, base.splits.clients[c].val])
                               for c in skew])
    removed = len(ann0.image_index) - len(ann1.image_index)
    target_train = (ann0.groups == g) & np.isin(ann0.image_index, skew_train)
    assert removed == summary["boxes_missing"] == round(0.5 * target_train.sum())
    others = ~target_train  # every other annotation row survives unchanged
    assert np.isin(ann0.image_index[others], ann1.image_index).all()
    assert len(ann1.image_index) >= others.sum()
    for i in range(len(base.source)):
        before, after = base.source.load_image(i), data.source.load_image(i)
        has_target = ((ann0.image_index == i) & (ann0.groups == g)).any()
        if i in skew_all and has_target:
            assert after.sum() < before.sum() and (after <= before).all()
        else:
            assert np.array_equal(before, after), i
    assert np.array_equal(data.splits.test, base.splits.test)


def test_quality_skew_needs_detection_data():
    class Tabular:
        num_clients, num_groups = 2, 2

    with pytest.raises(ValueError, match="detection data"):
        apply_quality_skew(Tabular(), QualitySkewSettings(), seed=0)


def test_scenario_config_composes():
    cfg = compose_config("scenario=quality_skew")
    assert cfg.dataset.partition == "iid" and cfg.dataset.quality_skew.missing_rate == 0.3
