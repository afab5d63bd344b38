"""attack.mia.method = lira | rmia (attacks/reference_mia.py, attacks/references.py): the reference models' training
sets, the OUT rule, the keys a run logs, an overfit model caught at low FPR through the wired scoring path, and
method=shadow left exactly as it was."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch

from resfl_lightning.attacks.privacy import plan_privacy_attacks
from resfl_lightning.attacks.privacy_attacks import PrivacyAttacks
from resfl_lightning.attacks.references import complementary_halves, out_references
from resfl_lightning.attacks.settings import MiaSettings
from resfl_lightning.attacks.targets import item_groups, sample_members, split_reserve, train_loader_for
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.config import ConfigError
from resfl_lightning.federation.local import local_train
from resfl_lightning.federation.orchestrator import FederationSettings
from tests.unit.attacks.test_attack_wiring import compose_cfg

tabular = pytest.importorskip("resfl_lightning.clients.tabular")
from resfl_lightning.data.tabular import federated_tabular_data  # noqa: E402

NEW_KEYS = ("attack/mia_auc", "attack/mia_tpr_at_fpr_0.1", "attack/mia_tpr_at_fpr_1")


def adult_like(n: int, features: int, seed: int, flip: float = 0.3):
    """Adult-like rows: mixed numeric / binary columns, a label from a noisy logistic rule (flip: share of labels
    flipped, which only memorisation fits), a binary group correlated with two columns."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype(np.float32)
    x[:, features // 2:] = (x[:, features // 2:] > 0.5).astype(np.float32)
    s = (x[:, 0] + rng.normal(size=n) > 0).astype(np.int64)
    y = (x @ rng.normal(size=features) + 0.5 * s > 0).astype(np.int64)
    y = np.where(rng.random(n) < flip, 1 - y, y)
    return x, y, s


def federation(n: int, features: int, rounds: int, tmp_path, seed: int = 0, hidden=(128, 64), lr: float = 0.05,
               reserve: float = 0.6):
    x, y, s = adult_like(n + 100, features, seed)
    splits = {"num_clients": 2, "reserve_fraction": reserve, "val_fraction": 0.1, "partition": "iid",
              "dirichlet_alpha": 0.5, "batch_size": 32}
    data = federated_tabular_data(x[:n], y[:n], s[:n], x[n:], y[n:], s[n:], num_groups=2, **splits, seed=seed)

    def factory():
        return tabular.TabularClient(features, 2, LossWeights(lambda_priv=0.0, lambda_fair=0.0), UfmSettings(),
                                     OptimSettings(lr=lr, weight_decay=0.0), hidden=hidden)

    settings = FederationSettings(rounds=rounds, local_epochs=1, run_dir=tmp_path)
    return SimpleNamespace(fabric=L.Fabric(accelerator="cpu", devices=1), data=data, client_factory=factory,
                           settings=settings)


def centralised_model(fed, rounds: int):
    """One model trained with the run's recipe on every client's training rows (a centralised target)."""
    members = np.concatenate([c.train for c in fed.data.splits.clients])
    torch.manual_seed(0)
    model = fed.client_factory()
    for r in range(rounds):
        local_train(fed.fabric, model, lambda e, r=r: train_loader_for(fed.data, members, seed=r), 1)
    return model, members


def attack(fed, model, rounds: int, **mia) -> dict:
    cb = PrivacyAttacks(seed=0, mia=MiaSettings(**mia))
    cb.on_fit_start(fed, state=None)
    metrics: dict = {}
    cb.on_round_end(fed, rounds - 1, model, metrics)
    return metrics


def test_complementary_halves_put_every_pool_item_in_exactly_half_of_the_references():
    pool = np.arange(100, 151)
    halves = complementary_halves(pool, 4, seed=3)
    trained = np.stack([np.isin(pool, h) for h in halves])
    assert (trained.sum(axis=0) == 2).all() and [len(h) for h in halves] == [25, 26, 25, 26]
    assert not np.array_equal(halves[0], halves[2])  # the pairs are different cuts
    assert all(np.array_equal(a, b) for a, b in zip(halves, complementary_halves(pool, 4, seed=3)))
    with pytest.raises(ValueError, match="even"):
        complementary_halves(pool, 3, seed=3)


def test_out_references_keep_per_example_only_the_models_that_did_not_train_on_it():
    conf = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6], [0.7, 0.8, 0.9], [1.0, 1.1, 1.2]])
    trained = np.array([[1, 0, 0], [0, 1, 1], [0, 1, 0], [1, 0, 1]], bool)  # two OUT models per example
    np.testing.assert_array_equal(out_references(conf, trained), [[0.4, 0.2, 0.3], [0.7, 1.1, 0.9]])
    np.testing.assert_array_equal(out_references(conf, np.zeros_like(trained)), conf)  # outside the pool: all K
    with pytest.raises(ValueError, match="same number"):
        out_references(conf, np.array([[1, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]], bool))


def test_mia_method_settings_are_checked():
    assert MiaSettings().method == "shadow" and MiaSettings().references == 4
    with pytest.raises(ConfigError, match="attack.mia.method"):
        MiaSettings(method="loss")
    with pytest.raises(ConfigError, match="attack.mia.references"):
        MiaSettings(references=3)
    with pytest.raises(ConfigError, match="rmia_offline_a"):
        MiaSettings(rmia_offline_a=0.0)


@pytest.mark.parametrize("method", ["lira", "rmia"])
def test_lira_and_rmia_log_the_new_keys_from_reference_models(method, tmp_path):
    rounds = 3
    fed = federation(300, 8, rounds, tmp_path, hidden=(16, 8))
    model, _ = centralised_model(fed, rounds)
    metrics = attack(fed, model, rounds, method=method, references=2)
    assert set(NEW_KEYS) <= set(metrics)
    assert 0.0 <= metrics["attack/mia_auc"] <= 1.0
    assert 0.0 <= metrics["attack/mia_tpr_at_fpr_0.1"] <= metrics["attack/mia_tpr_at_fpr_1"] <= 1.0
    assert metrics["attack/mia_n_members"] == metrics["attack/mia_n_nonmembers"] > 20  # 50/50
    assert metrics["attack/mia_references"] == 2.0
    assert "attack/mia_success_rate" not in metrics  # the shadow attack's balanced accuracy: not run
    written = (tmp_path / "attacks" / f"privacy_round_{rounds - 1:04d}.json").read_text()
    assert f'"method": "{method}"' in written and '"reference_rounds": 3' in written


def test_method_shadow_plans_and_trains_exactly_what_it_did_before(tmp_path):
    """The default composes to shadow, and its plan draws the same split and members, sets up the same shadow and
    nothing else; lira plans the same split and members (the same target rows are scored) without a shadow."""
    cfg = compose_cfg("attack=privacy")
    assert cfg.attack.mia.method == "shadow"
    fed = federation(300, 8, 2, tmp_path)
    groups = item_groups(fed.data)
    np.random.seed(7)
    torch.manual_seed(7)
    expected = (np.random.rand(3), torch.rand(3))
    np.random.seed(7)
    torch.manual_seed(7)
    shadow = plan_privacy_attacks(fed, 5, MiaSettings(), None)
    np.testing.assert_array_equal(np.random.rand(3), expected[0])  # planning draws nothing from the run's streams
    torch.testing.assert_close(torch.rand(3), expected[1])
    split = split_reserve(fed.data.splits.reserve, groups, MiaSettings(), 5)
    for part in ("shadow_members", "shadow_nonmembers", "target_nonmembers"):
        np.testing.assert_array_equal(getattr(shadow.split, part), getattr(split, part))
    np.testing.assert_array_equal(shadow.members, sample_members(fed.data, len(split.target_nonmembers), 5))
    assert shadow.references is None and shadow.shadow.seed == 5
    np.testing.assert_array_equal(shadow.shadow.indices, split.shadow_members)
    lira = plan_privacy_attacks(fed, 5, MiaSettings(method="lira"), None)
    assert lira.shadow is None and len(lira.references.models) == 4
    np.testing.assert_array_equal(lira.members, shadow.members)
    np.testing.assert_array_equal(lira.split.target_nonmembers, split.target_nonmembers)
    pool = np.sort(np.concatenate([split.shadow_members, split.shadow_nonmembers]))
    np.testing.assert_array_equal(lira.references.pool, pool)
    assert not np.isin(np.concatenate([lira.members, split.target_nonmembers]), pool).any()


@pytest.mark.slow  # ~10 s per method on an idle CPU (4 references x 80 one-epoch rounds)
@pytest.mark.parametrize("method", ["lira", "rmia"])
def test_an_overfit_model_is_caught_at_low_fpr(method, tmp_path):
    """The issue's reference check: a centralised model trained to ~100 % train accuracy on a few hundred Adult-like
    rows (30 % of labels flipped) leaks membership; LiRA / RMIA through the wired path reach TPR at 1 % FPR of at
    least 5x the FPR. The shadow rows are 80 % of the reserve so that each reference trains on about as many rows as
    the target (a reference on much less data is less confident everywhere, which the scores read as membership)."""
    rounds = 80
    fed = federation(1200, 12, rounds, tmp_path, reserve=0.65)
    model, members = centralised_model(fed, rounds)
    pred = model.collect(fed.data.loader_for(members))
    assert (pred.probs.argmax(1) == pred.y).float().mean() >= 0.99
    metrics = attack(fed, model, rounds, method=method, references=4, shadow_member_fraction=0.4,
                     shadow_nonmember_fraction=0.4, rmia_offline_a=0.3)  # a = 1 reaches only 0.03-0.05 here
    assert metrics["attack/mia_n_nonmembers"] >= 150  # 1 % FPR: at most one false positive
    assert metrics["attack/mia_tpr_at_fpr_1"] >= 5 * 0.01
    assert metrics["attack/mia_auc"] > 0.75


def test_audit_settings_are_checked():
    assert MiaSettings(audit="rmia", per_client=True).reference_method == "rmia"
    assert MiaSettings().reference_method is None and MiaSettings(method="lira").reference_method == "lira"
    with pytest.raises(ConfigError, match="attack.mia.audit"):
        MiaSettings(audit="shadow")
    with pytest.raises(ConfigError, match="attack.mia.audit"):
        MiaSettings(method="rmia", audit="lira")


def test_the_audit_beside_the_shadow_attack_is_each_attack_alone(tmp_path):
    """attack.mia.audit=rmia in one run gives the shadow attack's keys of a shadow-only run and, as attack/mia_audit_*,
    the keys of an rmia-only run on the same model, to the bit: the shadow and the references train in isolated RNG
    streams of their own, on the same split. The worst client and peak round come from the audit's scores."""
    from resfl_lightning.attacks.mia_keys import audit_key

    rounds = 2
    runs = {}
    for name, mia in {"shadow": {}, "rmia": {"method": "rmia", "references": 2, "per_client": True},
                      "both": {"audit": "rmia", "references": 2, "per_client": True}}.items():
        fed = federation(300, 8, rounds, tmp_path / name, hidden=(16, 8))
        model, _ = centralised_model(fed, rounds)
        runs[name] = attack(fed, model, rounds, **mia)
    both = runs["both"]
    shadow_keys = {k: v for k, v in runs["shadow"].items() if not k.endswith("_time")}
    assert shadow_keys and {k: both[k] for k in shadow_keys} == shadow_keys
    audit = {audit_key(k): v for k, v in runs["rmia"].items() if not k.endswith("_time")}
    assert {"attack/mia_audit_auc", "attack/mia_audit_tpr_at_fpr_1", "attack/mia_audit_worst_client",
            "attack/mia_audit_peak_round"} <= set(audit)
    assert {k: both[k] for k in audit} == audit
    assert not any(k.startswith("attack/mia_worst_client") or k.startswith("attack/mia_peak") for k in both)
    written = (tmp_path / "both" / "attacks" / f"privacy_round_{rounds - 1:04d}.json").read_text()
    assert '"mia_audit"' in written and '"method": "rmia"' in written
    # the weather rows (audit=False) score the shadow attack alone: no reference model is evaluated for them
    from resfl_lightning.attacks.privacy import privacy_attacks

    plan = plan_privacy_attacks(fed, 0, MiaSettings(audit="rmia", references=2), None)
    metrics, details = privacy_attacks(plan, fed, model, rounds - 1, audit=False)
    assert "mia_audit" not in details and not any(k.startswith("attack/mia_audit_") for k in metrics)
    assert {k: metrics[k] for k in shadow_keys} == shadow_keys and plan.references.rounds_done == 0
