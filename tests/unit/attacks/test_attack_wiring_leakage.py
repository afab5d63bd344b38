"""The wired privacy attacks (attacks/privacy_attacks.py: reserve split, shadow model, members from client training
sets, representation probe) succeed where leakage exists and fall to chance where it does not. A tabular client keeps
this fast; the detection path differs only in feature extraction (test_attack_wiring_features.py)."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch

from resfl_lightning.attacks.privacy_attacks import PrivacyAttacks
from resfl_lightning.attacks.settings import AiaSettings, MiaSettings, ProbeSettings
from resfl_lightning.attacks.targets import train_loader_for
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.data.federated import base_data
from resfl_lightning.federation.local import local_train
from resfl_lightning.federation.orchestrator import FederationSettings

tabular = pytest.importorskip("resfl_lightning.clients.tabular")
from resfl_lightning.data.tabular import federated_tabular_data  # noqa: E402

ROUNDS, FEATURES = 30, 12  # 30 one-epoch rounds at lr 0.05 memorise random labels


def make_data(group_in_features: bool, seed: int = 0):
    """Random labels (only memorisation fits them); the group is feature 0 or independent of every feature."""
    rng = np.random.default_rng(seed)
    n = 900
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.integers(0, 2, n)
    s = rng.integers(0, 2, n)
    if group_in_features:
        x[:, 0] = 3.0 * s + 0.3 * rng.normal(size=n)
    splits = {"num_clients": 2, "reserve_fraction": 0.6,
              "val_fraction": 0.1, "partition": "iid", "dirichlet_alpha": 0.5, "batch_size": 32}
    return federated_tabular_data(x[:700], y[:700], s[:700], x[700:], y[700:], s[700:], num_groups=2, **splits,
                                  seed=seed)


def factory():
    return tabular.TabularClient(FEATURES, 2, LossWeights(lambda_priv=0.0, lambda_fair=0.0), UfmSettings(),
                                 OptimSettings(lr=0.05, weight_decay=0.0), hidden=(128, 64))


def run_attacks(data, target_indices, tmp_path) -> dict:
    """Train a 'global model' with the run recipe on target_indices, then run the MIA + AIA callback on it."""
    fabric = L.Fabric(accelerator="cpu", devices=1)
    settings = FederationSettings(rounds=ROUNDS, local_epochs=1, run_dir=tmp_path)
    fed = SimpleNamespace(fabric=fabric, data=data, client_factory=factory, settings=settings)
    torch.manual_seed(0)
    model = factory()
    for r in range(ROUNDS):
        local_train(fabric, model, lambda e, r=r: train_loader_for(data, target_indices, seed=r), 1)
    cb = PrivacyAttacks(seed=0, mia=MiaSettings(), aia=AiaSettings(probe=ProbeSettings(epochs=30)))
    cb.on_fit_start(fed, state=None)
    metrics: dict = {}
    cb.on_round_end(fed, ROUNDS - 1, model, metrics)
    return metrics


def test_mia_succeeds_on_members_and_is_at_chance_on_unseen_data(tmp_path):
    data = make_data(group_in_features=False)
    members = np.concatenate([c.train for c in base_data(data).splits.clients])
    leaky = run_attacks(data, members, tmp_path / "leaky")
    assert leaky["attack/mia_n_members"] == leaky["attack/mia_n_nonmembers"] > 50
    assert leaky["attack/mia_success_rate"] > 0.65 and leaky["attack/mia_auc"] > 0.7
    assert leaky["attack/mia_tpr_at_fpr_10"] > 0.2
    # Same recipe, but the model never saw the client training sets: nothing to infer.
    unseen = run_attacks(data, data.splits.test, tmp_path / "unseen")
    assert abs(unseen["attack/mia_success_rate"] - 0.5) < 0.1 and abs(unseen["attack/mia_auc"] - 0.5) < 0.12


def test_representation_aia_succeeds_only_when_features_encode_the_group(tmp_path):
    results = {}
    for leaks in (True, False):
        data = make_data(group_in_features=leaks, seed=1)
        members = np.concatenate([c.train for c in data.splits.clients])
        results[leaks] = run_attacks(data, members, tmp_path / str(leaks))
    leaky = results[True]
    assert leaky["attack/aia_balanced_accuracy"] > leaky["attack/aia_chance_uniform"] + 0.25
    no = results[False]
    assert no["attack/aia_balanced_accuracy"] < no["attack/aia_chance_uniform"] + 0.1
