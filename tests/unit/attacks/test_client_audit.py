"""attack.mia.per_client (attacks/client_audit.py): each client's own membership leakage from the global scores,
the worst client and the round of peak leakage; checked against scikit-learn and hand cases, and through the wired
reference attack on a model that memorised one client only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from resfl_lightning.attacks.client_audit import member_clients, peak_round, per_client_metrics, worst_client
from resfl_lightning.attacks.privacy_attacks import PrivacyAttacks
from resfl_lightning.attacks.settings import MiaSettings
from resfl_lightning.attacks.targets import train_loader_for
from resfl_lightning.config import ConfigError
from resfl_lightning.federation.local import local_train
from tests.unit.attacks.test_reference_mia import federation


def test_members_are_assigned_to_the_client_whose_training_split_holds_them():
    train = [np.array([1, 4, 7]), np.array([2, 3]), np.array([9])]
    np.testing.assert_array_equal(member_clients(np.array([3, 1, 9, 7]), train), [1, 0, 2, 0])
    with pytest.raises(ValueError, match="1 target members are in no client"):
        member_clients(np.array([1, 5]), train)
    with pytest.raises(ValueError, match="client 1 and another"):
        member_clients(np.array([4]), [np.array([4]), np.array([4])])


def test_per_client_metrics_are_each_clients_members_against_every_nonmember():
    rng = np.random.default_rng(0)
    scores = np.concatenate([rng.normal(2.0, 1.0, 40), rng.normal(0.0, 1.0, 40), [5.0]])
    owners = np.array([0] * 40 + [1] * 40 + [2])  # client 2: one member only -> no AUC of its own
    nonmembers = rng.normal(0.0, 1.0, 200)
    out = per_client_metrics(scores, owners, nonmembers, num_clients=3)
    assert sorted(out) == [0, 1]
    for k in (0, 1):
        members = scores[owners == k]
        labels = np.r_[np.ones(members.size), np.zeros(nonmembers.size)]
        assert out[k]["auc"] == pytest.approx(roc_auc_score(labels, np.r_[members, nonmembers]))
        assert out[k]["n_members"] == 40 and out[k]["n_nonmembers"] == 200
    assert out[0]["auc"] > 0.85 > 0.65 > out[1]["auc"]  # the shifted client leaks, the other one does not


def test_worst_client_and_peak_round_break_ties_as_declared():
    clients = {0: {"auc": 0.7, "tpr_at_fpr_1": 0.1, "n_nonmembers": 100},
               1: {"auc": 0.9, "tpr_at_fpr_1": 0.1, "n_nonmembers": 100},
               2: {"auc": 0.6, "tpr_at_fpr_1": 0.3, "n_nonmembers": 100}}
    assert worst_client(clients)[0] == 2  # TPR at 1 % FPR first
    assert worst_client({k: v for k, v in clients.items() if k != 2})[0] == 1  # then the AUC
    few = {k: {**v, "n_nonmembers": 60} for k, v in clients.items()}  # 1 % FPR unresolved: the AUC decides
    assert worst_client(few)[0] == 1
    assert worst_client({3: clients[0], 1: clients[0]})[0] == 1 and worst_client({}) is None
    assert peak_round({0: 0.6, 1: 0.8, 2: 0.8, 3: float("nan")}) == (1, 0.8)
    assert peak_round({}) is None


def test_per_client_needs_a_reference_method():
    assert MiaSettings(method="rmia", per_client=True).per_client
    with pytest.raises(ConfigError, match="attack.mia.per_client"):
        MiaSettings(per_client=True)


def test_a_model_that_memorised_one_client_names_that_client_every_round(tmp_path):
    """The global model is trained on client 0's rows only (many epochs): client 0 is the worst client, its AUC well
    above client 1's, whose 'members' the model never saw; the peak round is read back from the round files."""
    rounds = 3
    fed = federation(300, 8, rounds, tmp_path, hidden=(64, 32), lr=0.1)
    client0 = fed.data.splits.clients[0].train
    torch.manual_seed(0)
    model = fed.client_factory()
    cb = PrivacyAttacks(seed=0, every=1, mia=MiaSettings(method="rmia", references=2, per_client=True))
    cb.on_fit_start(fed, state=None)
    seen = []
    for r in range(rounds):
        local_train(fed.fabric, model, lambda e, r=r: train_loader_for(fed.data, client0, seed=r), 20)
        metrics: dict = {}
        cb.on_round_end(fed, r, model, metrics)
        seen.append(metrics)
        assert metrics["attack/mia_worst_client"] == 0.0
        assert metrics["attack/mia_peak_round"] <= r
    final = seen[-1]
    aucs = [m["attack/mia_auc"] for m in seen]
    assert final["attack/mia_peak_round"] == float(int(np.argmax(aucs)))
    assert final["attack/mia_peak_round_auc"] == pytest.approx(max(aucs))
    import json

    clients = json.loads((tmp_path / "attacks" / f"privacy_round_{rounds - 1:04d}.json").read_text())["mia"]["clients"]
    assert clients["0"]["auc"] > clients["1"]["auc"] + 0.1
    assert final["attack/mia_worst_client_auc"] == pytest.approx(clients["0"]["auc"])
