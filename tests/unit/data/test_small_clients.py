"""Clients too small for their train/val split are named (warning or error), on every partition."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from resfl_lightning.data.partition import SmallClientWarning, make_federated_splits, split_shortfall


def test_shortfall_follows_the_validation_rounding():
    assert split_shortfall(10, 0.1) == ""  # 1 validation, 9 training items
    assert "no validation item" in split_shortfall(4, 0.1)  # round(0.4) = 0
    assert "1 training item(s)" in split_shortfall(2, 0.5)
    assert split_shortfall(2, 0.0) == ""


def test_ten_thousand_iid_clients_on_few_rows_are_named_not_scored_silently():
    groups = np.random.default_rng(0).integers(0, 3, 30000)
    with pytest.warns(SmallClientWarning, match=r"10000 of 10000 clients.*client '0' \(3 items: no validation"):
        splits = make_federated_splits(groups, num_clients=10000, test_fraction=0.0, reserve_fraction=0.0)
    assert sum(len(c.val) for c in splits.clients) == 0
    with pytest.raises(ValueError, match=r"small_clients=error.*client '0'"):
        make_federated_splits(groups, num_clients=10000, test_fraction=0.0, reserve_fraction=0.0,
                              small_clients="error")


def test_clients_with_enough_rows_keep_todays_splits_and_raise_nothing():
    groups = np.random.default_rng(1).integers(0, 4, 2000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for partition in ("iid", "dirichlet"):
            a = make_federated_splits(groups, num_clients=5, partition=partition, seed=3)
            b = make_federated_splits(groups, num_clients=5, partition=partition, seed=3, small_clients="error")
            for ca, cb in zip(a.clients, b.clients, strict=True):
                np.testing.assert_array_equal(ca.train, cb.train)
                np.testing.assert_array_equal(ca.val, cb.val)
            assert a.client_names == ()


def test_column_partition_and_its_h_tv():
    groups = np.array([0, 0, 1, 1] * 50)
    labels = np.array(["a"] * 100 + ["b"] * 100)  # a holds rows 0..99, b the rest; group mix equal
    splits = make_federated_splits(groups, num_clients=2, test_fraction=0.0, reserve_fraction=0.0,
                                   partition="column", client_labels=labels)
    assert splits.client_names == ("a", "b") and splits.h_tv == pytest.approx(0.0)
    assert set(splits.client_indices(0).tolist()) == set(range(100))
    skewed = make_federated_splits(groups, num_clients=2, test_fraction=0.0, reserve_fraction=0.0,
                                   partition="column", client_labels=np.where(groups == 0, "a", "b"))
    assert skewed.h_tv == pytest.approx(0.5)  # each client holds one group: 0.5 * |1 - 0.5| * 2
    with pytest.raises(ValueError, match="merge needs partition=column"):
        make_federated_splits(groups, num_clients=2, small_clients="merge")
