"""FederatedTabularData on the real UCI Adult files: splits, loaders, preflight errors; plus loader edge cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from resfl_lightning.config import ConfigError
from resfl_lightning.data.adult import load_adult
from resfl_lightning.data.datasets.adult import AdultDataset
from resfl_lightning.data.federated import build_federated_data, instantiate_dataset
from resfl_lightning.data.tabular import federated_tabular_data

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[3]


def build(cfg, seed: int):
    return instantiate_dataset(cfg).build(seed)


def preflight(cfg) -> None:
    """The dataset's keys checked (as before any run), then its preflight."""
    instantiate_dataset(cfg).preflight()


def adult_cfg(root, **overrides):
    cfg = OmegaConf.load(REPO / "conf" / "dataset" / "adult.yaml")
    cfg.pop("defaults")
    cfg.root = None if root is None else str(root)
    for k, v in overrides.items():
        cfg[k] = v
    return cfg


@pytest.fixture(scope="module")
def reference(adult_dir):
    return load_adult(adult_dir, sensitive="race")


@pytest.fixture(scope="module")
def data(adult_dir):
    return build(adult_cfg(adult_dir), seed=0)


def test_the_yaml_names_the_adult_class():
    assert type(instantiate_dataset(adult_cfg(None))) is AdultDataset


def test_adult_splits_use_adult_test_and_shard_adult_data(data, reference):
    n_train, n_test = len(reference.y_train), len(reference.y_test)
    assert (n_train, n_test) == (30162, 15060)  # complete rows of the UCI originals
    assert data.num_clients == 4 and data.num_groups == 5 and data.num_classes == 2 and data.task == "classification"
    assert data.num_features == 105 and list(data.feature_names) == reference.feature_names
    sp = data.splits
    np.testing.assert_array_equal(sp.test, np.arange(n_train, n_train + n_test))
    assert torch.equal(data.x[n_train:], torch.from_numpy(reference.X_test))
    assert torch.equal(data.y[n_train:], torch.from_numpy(reference.y_test))
    assert torch.equal(data.groups[:n_train], torch.from_numpy(reference.s_train))
    assert len(sp.reserve) == round(0.05 * n_train) and sp.reserve.max() < n_train
    local = np.concatenate([sp.client_indices(i) for i in range(4)] + [sp.reserve])
    np.testing.assert_array_equal(np.sort(local), np.arange(n_train))  # every training row used exactly once
    # IID: every client holds a quarter of each group (+-1 row, +-1 more from the reserve/val rounding).
    s = reference.s_train
    pool_counts = np.bincount(s[np.concatenate([sp.client_indices(i) for i in range(4)])], minlength=5)
    for i in range(4):
        counts = np.bincount(s[sp.client_indices(i)], minlength=5)
        assert np.all(np.abs(counts - pool_counts / 4) <= 1)
        assert abs(len(sp.clients[i].val) / len(sp.client_indices(i)) - 0.1) < 0.002
        assert data.num_train(i) == len(sp.clients[i].train)
    assert sp.h_tv < 0.01


def test_loaders_yield_rows_of_the_right_split(data):
    batch = next(iter(data.train_loader(1, seed=5)))
    assert batch["x"].dtype == torch.float32 and batch["x"].shape == (256, 105)
    assert batch["y"].dtype == batch["groups"].dtype == batch["index"].dtype == torch.int64
    assert torch.equal(batch["x"], data.x[batch["index"]]) and torch.equal(batch["y"], data.y[batch["index"]])
    seen = torch.cat([b["index"] for b in data.train_loader(1, seed=5)]).numpy()
    np.testing.assert_array_equal(np.sort(seen), data.splits.clients[1].train)
    again = torch.cat([b["index"] for b in data.train_loader(1, seed=5)]).numpy()
    other = torch.cat([b["index"] for b in data.train_loader(1, seed=6)]).numpy()
    np.testing.assert_array_equal(seen, again)  # seeded shuffle
    assert not np.array_equal(seen, other)
    val = torch.cat([b["index"] for b in data.val_loader(2)]).numpy()
    np.testing.assert_array_equal(val, data.splits.clients[2].val)  # evaluation loaders keep split order
    assert sum(len(b["y"]) for b in data.test_loader()) == 15060
    np.testing.assert_array_equal(torch.cat([b["index"] for b in data.reserve_loader()]).numpy(), data.splits.reserve)
    picked = np.array([3, 30161, 30162, 45221])
    np.testing.assert_array_equal(next(iter(data.loader_for(picked)))["index"].numpy(), picked)
    with pytest.raises(ValueError, match="row indices"):
        data.loader_for(np.array([45222]))


def test_build_federated_data_goes_through_the_registry(adult_dir):
    lines = []
    data = build_federated_data(adult_cfg(adult_dir, sensitive="sex", num_clients=3), seed=1, printer=lines.append)
    assert data.num_groups == 2 and data.num_clients == 3 and data.group_names == ("Male", "Female")
    assert "test=15060" in lines[0]


def test_dirichlet_partition_is_heterogeneous(adult_dir, data):
    skewed = build(adult_cfg(adult_dir, partition="dirichlet", dirichlet_alpha=0.3), seed=0)
    assert skewed.splits.partition == "dirichlet" and skewed.splits.h_tv > 10 * data.splits.h_tv
    np.testing.assert_array_equal(skewed.splits.test, data.splits.test)


def test_drop_sensitive_changes_the_feature_count(adult_dir):
    with pytest.raises(ConfigError, match="dataset.num_features=100"):
        preflight(adult_cfg(adult_dir, drop_sensitive=True))
    data = build(adult_cfg(adult_dir, drop_sensitive=True, num_features=100), seed=0)
    assert data.num_features == 100 and not any(n.startswith("race=") for n in data.feature_names)
    preflight(adult_cfg(adult_dir, sensitive="sex", drop_sensitive=True, num_features=103))


def test_preflight_names_dataset_root_and_files(tmp_path, adult_dir):
    with pytest.raises(ConfigError, match=r"dataset\.root: not set.*adult\.data and adult\.test"):
        preflight(adult_cfg(None))
    (tmp_path / "adult.data").write_text("")
    with pytest.raises(ConfigError, match=r"dataset\.root: .* lacks adult\.test"):
        preflight(adult_cfg(tmp_path))
    preflight(adult_cfg(tmp_path, download=True))  # allowed to fetch: nothing to complain about yet
    with pytest.raises(ConfigError, match="dataset.sensitive"):
        preflight(adult_cfg(adult_dir, sensitive="age"))
    with pytest.raises(ConfigError, match="dataset.num_features"):
        preflight(adult_cfg(adult_dir, num_features=104))
    with pytest.raises(ConfigError, match="dataset.test_fraction"):
        build(adult_cfg(adult_dir, test_fraction=0.2), seed=0)


def toy(n_train: int, batch_size: int):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n_train + 10, 3)).astype(np.float32)
    y, s = rng.integers(0, 2, n_train + 10), rng.integers(0, 2, n_train + 10)
    return federated_tabular_data(x[:n_train], y[:n_train], s[:n_train], x[n_train:], y[n_train:], s[n_train:],
                                  num_groups=2, seed=0, num_clients=1, reserve_fraction=0.0, val_fraction=0.0,
                                  batch_size=batch_size)


def test_train_loader_drops_only_a_single_row_last_batch():
    sizes = [len(b["y"]) for b in toy(n_train=65, batch_size=32).train_loader(0, seed=0)]
    assert sizes == [32, 32]  # a 1-row batch would break BatchNorm in train mode
    sizes = [len(b["y"]) for b in toy(n_train=66, batch_size=32).train_loader(0, seed=0)]
    assert sizes == [32, 32, 2]
    assert [len(b["y"]) for b in toy(n_train=65, batch_size=32).test_loader()] == [10]
