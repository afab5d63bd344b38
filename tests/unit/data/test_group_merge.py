"""dataset.merge_groups_below: the sensitive values with fewer training rows become one group, named by its values,
before any split, so every split (test rows drawn from the file included) holds the merged group."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from resfl_lightning.config import ConfigError
from resfl_lightning.data.errors import TableError
from resfl_lightning.data.federated import instantiate_dataset
from resfl_lightning.data.table_loader import TableSpec, load_table
from tests.unit.data.test_csv_loader import REPO


def table(counts: dict[str, int], seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    race = rng.permutation(np.concatenate([[g] * n for g, n in counts.items()]))
    x = rng.normal(size=race.size).round(3)
    return pd.DataFrame({"x": x, "race": race, "approved": np.where(x > 0, "yes", "no")})


def spec(below: int) -> TableSpec:
    return TableSpec(target="approved", positive=("yes",), sensitive=("race",), merge_groups_below=below)


def test_rare_groups_become_one_group_in_the_place_of_the_first(tmp_path):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    table({"White": 100, "Black": 60, "Asian": 30, "Other": 12}).to_csv(train, index=False)
    table({"White": 40, "Black": 20, "Asian": 10, "Other": 12}, seed=1).to_csv(test, index=False)
    plain, merged = load_table(train, test, spec(0)), load_table(train, test, spec(50))
    assert plain.group_names == ["Asian", "Black", "Other", "White"]
    assert merged.group_names == ["Asian+Other", "Black", "White"]
    # group ids: Asian (0) and Other (2) are one group 0; Black 1; White 3 -> 2
    remap = np.array([0, 1, 0, 2])
    for split in ("s_train", "s_test"):
        assert np.array_equal(getattr(merged, split), remap[getattr(plain, split)])
    assert np.bincount(merged.s_test).tolist() == [22, 20, 40]
    np.testing.assert_array_equal(merged.X_test, plain.X_test)  # the features do not read the groups


def test_one_rare_group_is_left_as_it_is_and_merging_every_group_is_refused(tmp_path, caplog):
    path = tmp_path / "p.csv"
    table({"White": 100, "Black": 60, "Other": 12}).to_csv(path, index=False)
    with caplog.at_level(logging.WARNING):
        one = load_table(path, None, spec(50), test_fraction=0.2)
    assert one.group_names == ["Black", "Other", "White"] and "nothing to merge it with" in caplog.text
    with pytest.raises(TableError, match="merges every group"):
        load_table(path, None, spec(500), test_fraction=0.2)


def test_the_merge_comes_before_the_test_split_which_stratifies_by_the_merged_group(tmp_path):
    path = tmp_path / "p.csv"
    table({"White": 300, "Black": 200, "Asian": 30, "Other": 20}).to_csv(path, index=False)
    t = load_table(path, None, spec(50), test_fraction=0.2, seed=3)
    assert t.group_names == ["Asian+Other", "Black", "White"]
    assert np.bincount(t.s_test).tolist() == [10, 40, 60]  # 20 % of each group, the merged 50 rows included
    assert np.bincount(t.s_train).tolist() == [40, 160, 240]


def test_the_csv_dataset_key(tmp_path):
    path = tmp_path / "p.csv"
    table({"White": 100, "Black": 60, "Asian": 30, "Other": 12}).to_csv(path, index=False)
    cfg = OmegaConf.load(REPO / "conf" / "dataset" / "csv.yaml")
    cfg.pop("defaults")
    assert cfg.merge_groups_below == 0  # the default merges nothing
    cfg.merge_with({"path": str(path), "target": "approved", "positive": ["yes"], "sensitive": "race"})
    assert instantiate_dataset(cfg).group_names(0) == ("Asian", "Black", "Other", "White")
    cfg.merge_groups_below = 50
    dataset = instantiate_dataset(cfg)
    assert dataset.group_names(0) == ("Asian+Other", "Black", "White")
    data = dataset.build(0)
    assert data.group_names == ("Asian+Other", "Black", "White") and data.num_groups == 3
    cfg.merge_groups_below = -1
    with pytest.raises(ConfigError, match="dataset.merge_groups_below"):
        instantiate_dataset(cfg)
