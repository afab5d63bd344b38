"""Partitioning: image groups, IID-stratified and Dirichlet shards, H_TV, stratified splits, federated splits."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from resfl_lightning.data.partition import (
    count_from_fraction,
    dirichlet_shards,
    h_tv,
    iid_stratified_shards,
    image_groups,
    make_federated_splits,
    stratified_split,
)


def _imbalanced_groups(n: int = 1003, seed: int = 0) -> np.ndarray:
    p = np.exp(-np.arange(10) / 4)
    g = np.random.default_rng(seed).choice(10, size=n, p=p / p.sum())
    g[:20] = -1  # a few items with unknown group
    return g


def _assert_partition(shards: list[np.ndarray], n: int) -> None:
    allidx = np.concatenate(shards)
    assert len(allidx) == n and len(np.unique(allidx)) == n and allidx.min() == 0 and allidx.max() == n - 1


def test_image_groups_majority_then_first():
    image_index = np.array([0, 0, 0, 1, 1, 2, 4, 4, 5, 5, 5, 5])
    groups = np.array([2, 2, 1, 1, 2, -1, -1, 3, 0, 4, 4, 0])
    # image 0: {2,2,1} -> 2; image 1: tie 1/2 -> 1 (first listed); 2: unknown only; 3: no persons; 4: 3;
    # image 5: tie 0/4 (two each) -> 0 (first listed)
    np.testing.assert_array_equal(image_groups(image_index, groups, 6), [2, 1, -1, -1, 3, 0])


def test_iid_shards_disjoint_equal_and_keep_group_mix():
    g = _imbalanced_groups()
    shards = iid_stratified_shards(g, 4, seed=1)
    _assert_partition(shards, len(g))
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    for label in np.unique(g):
        per_client = [(g[s] == label).sum() for s in shards]
        assert max(per_client) - min(per_client) <= 1, f"group {label}: {per_client}"
    assert h_tv(shards, g) < 0.02
    again = iid_stratified_shards(g, 4, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))
    assert not np.array_equal(iid_stratified_shards(g, 4, seed=2)[0], shards[0])


def test_h_tv_hand_computed():
    g = np.array([0, 0, 0, 1, 1, 2])
    # p_global = (1/2, 1/3, 1/6); client A (1, 0, 0): TV 1/2; client B (0, 2/3, 1/3): TV 1/2
    assert h_tv([np.array([0, 1, 2]), np.array([3, 4, 5])], g) == pytest.approx(0.5)
    # client A (2/3, 1/3, 0): TV 1/6; client B (1/3, 1/3, 1/3): TV 1/6
    assert h_tv([np.array([0, 1, 3]), np.array([2, 4, 5])], g) == pytest.approx(1 / 6)
    # one client holding everything has exactly the global mix
    assert h_tv([np.arange(6)], g) == pytest.approx(0.0)


def test_dirichlet_shards_equal_disjoint_and_cover():
    g = _imbalanced_groups(2001)
    for alpha in (0.05, 0.5, 5.0):
        shards = dirichlet_shards(g, 7, alpha, seed=3)
        _assert_partition(shards, len(g))
        sizes = [len(s) for s in shards]
        assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("centre", ["uniform", "global"])
def test_dirichlet_h_tv_grows_as_alpha_shrinks(centre):
    g = _imbalanced_groups(4000)
    mean_h = [np.mean([h_tv(dirichlet_shards(g, 10, a, seed=s, centre=centre), g) for s in range(5)])
              for a in (100.0, 1.0, 0.1)]
    assert mean_h[0] < mean_h[1] < mean_h[2]
    assert mean_h[2] > 0.5
    if centre == "global":  # centred on the global mix: large alpha is close to IID
        assert mean_h[0] < 0.1
    else:  # centred on equal shares: even large alpha departs from an imbalanced global mix
        balanced = np.repeat(np.arange(5), 800)
        assert np.mean([h_tv(dirichlet_shards(balanced, 10, 100.0, seed=s), balanced) for s in range(5)]) < 0.1


def test_dirichlet_two_groups_matches_beta_binomial_reference():
    """G = 2: client i's count of group 0 is BetaBinomial(n_i, alpha, alpha), so E TV_i = E|k/n_i - 1/2|."""
    g = np.repeat([0, 1], 10_000)
    n_i = 200  # 100 clients
    k = np.arange(n_i + 1)
    for alpha in (0.5, 2.0):
        reference = float((stats.betabinom.pmf(k, n_i, alpha, alpha) * np.abs(k / n_i - 0.5)).sum())
        observed = np.mean([h_tv(dirichlet_shards(g, 100, alpha, seed=s), g) for s in range(3)])
        # the last clients get what is left, which biases H_TV up slightly
        assert observed == pytest.approx(reference, rel=0.15)


def test_stratified_split_fractions_per_group():
    g = _imbalanced_groups(2000)
    indices = np.random.default_rng(4).choice(2000, size=1500, replace=False)
    rest, held = stratified_split(indices, g, 0.1, seed=5)
    assert len(held) == 150 and len(rest) == 1350
    assert len(np.intersect1d(rest, held)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([rest, held])), np.sort(indices))
    for label in np.unique(g[indices]):
        n_g = (g[indices] == label).sum()
        h_g = (g[held] == label).sum()
        assert np.floor(0.1 * n_g) <= h_g <= np.ceil(0.1 * n_g), f"group {label}: {h_g} of {n_g}"
    rest2, held2 = stratified_split(indices, g, 0.1, seed=5)
    np.testing.assert_array_equal(held, held2)
    assert len(stratified_split(indices, g, 0.0, seed=5)[1]) == 0


def test_make_federated_splits_disjoint_and_sized():
    g = _imbalanced_groups(3000)
    splits = make_federated_splits(g, num_clients=4, test_fraction=0.2, reserve_fraction=0.05, val_fraction=0.1,
                                   seed=11)
    parts = [splits.test, splits.reserve] + [a for c in splits.clients for a in (c.train, c.val)]
    _assert_partition(parts, len(g))
    assert len(splits.test) == 600 and len(splits.reserve) == 150
    sizes = splits.sizes()
    assert sizes["test"] + sizes["reserve"] + sizes["train_total"] + sizes["val_total"] == 3000
    client_sizes = [len(splits.client_indices(i)) for i in range(4)]
    assert max(client_sizes) - min(client_sizes) <= 1
    for c in splits.clients:
        assert abs(len(c.val) / (len(c.train) + len(c.val)) - 0.1) < 0.01
    # the reserve and test sets keep the global group mix
    for part in (splits.test, splits.reserve):
        assert h_tv([part, np.arange(len(g))], g) < 0.05
    assert splits.h_tv < 0.03 and splits.partition == "iid"
    same = make_federated_splits(g, 4, seed=11)
    np.testing.assert_array_equal(same.clients[2].val, splits.clients[2].val)
    assert not np.array_equal(make_federated_splits(g, 4, seed=12).test, splits.test)


def _reference_iid_shards(groups: np.ndarray, num_clients: int, seed: int) -> list[np.ndarray]:
    """The dealing rule written out with one mask per client (O(clients x items)): the same draws, the same shards."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(groups))
    order = order[np.argsort(groups[order], kind="stable")]
    owner = rng.permutation(num_clients)[np.arange(len(groups)) % num_clients]
    return [np.sort(order[owner == i]) for i in range(num_clients)]


@pytest.mark.parametrize(("n", "num_clients"), [(1003, 1), (1003, 4), (1003, 1003), (5000, 333)])
def test_iid_shards_equal_the_per_client_mask_reference(n, num_clients):
    g = _imbalanced_groups(n, seed=n)
    got, want = iid_stratified_shards(g, num_clients, seed=3), _reference_iid_shards(g, num_clients, seed=3)
    assert len(got) == len(want) == num_clients
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_make_federated_splits_checks_the_groups_a_fixed_number_of_times():
    """Checking (and copying) every item's group once per client made the splits O(clients x items): 10,000 clients
    of 320 rows took minutes. The count must not grow with the number of clients."""
    from unittest import mock

    from resfl_lightning.data import partition

    g = _imbalanced_groups(4000)
    counts = []
    for num_clients in (4, 400):
        with mock.patch.object(partition, "_groups_array", wraps=partition._groups_array) as checked:
            make_federated_splits(g, num_clients, seed=0)
        counts.append(checked.call_count)
    assert counts[0] == counts[1] <= 6


def test_duplicate_indices_are_found_wherever_they_are():
    from resfl_lightning.data.partition import _has_duplicates

    rng = np.random.default_rng(0)
    assert not _has_duplicates(np.empty(0, np.int64)) and not _has_duplicates(np.array([5]))
    for n in (2, 50, 1000):
        items = rng.permutation(10 * n)[:n]
        assert not _has_duplicates(items)
        j, k = rng.choice(n, size=2, replace=False)
        items[k] = items[j]
        assert _has_duplicates(items) and len(np.unique(items)) < n  # np.unique: the independent reference
    with pytest.raises(ValueError, match="duplicates"):
        stratified_split(np.array([3, 1, 3]), np.zeros(5, np.int64), 0.5, seed=0)


def test_make_federated_splits_dirichlet_is_heterogeneous():
    g = _imbalanced_groups(3000)
    iid = make_federated_splits(g, 5, seed=0)
    non_iid = make_federated_splits(g, 5, partition="dirichlet", alpha=0.3, seed=0)
    parts = [non_iid.test, non_iid.reserve] + [a for c in non_iid.clients for a in (c.train, c.val)]
    _assert_partition(parts, len(g))
    assert non_iid.h_tv > iid.h_tv + 0.2 and non_iid.alpha == 0.3
    np.testing.assert_array_equal(non_iid.test, iid.test)  # the test split does not depend on the partition


def test_bad_arguments_raise():
    g = np.array([0, 1, 0, 1])
    with pytest.raises(ValueError, match="client"):
        iid_stratified_shards(g, 5, seed=0)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_shards(g, 2, 0.0, seed=0)
    with pytest.raises(ValueError, match="centre"):
        dirichlet_shards(g, 2, 1.0, seed=0, centre="local")
    with pytest.raises(ValueError, match="fraction"):
        stratified_split(np.arange(4), g, 1.0, seed=0)
    with pytest.raises(ValueError, match="partition"):
        make_federated_splits(g, 2, partition="shards")
    with pytest.raises(ValueError, match="groups"):
        iid_stratified_shards(np.array([0.5, 1.0]), 2, seed=0)
    with pytest.raises(ValueError, match="duplicates"):
        stratified_split(np.array([0, 0, 1]), g, 0.5, seed=0)


def test_count_from_fraction():
    assert count_from_fraction(4, 0.25) == 1
    assert count_from_fraction(5, 0.5) == 3  # halves round up
    assert count_from_fraction(10, 0.35) == 4  # 3.4999999 in floating point still rounds to 4
    assert count_from_fraction(10, 0.0) == 0
    with pytest.raises(ValueError, match="fraction"):
        count_from_fraction(4, 1.5)
