"""Attack wiring: EOD, settings and config groups, reserve split, Byzantine, poisoning wrapper, scores, compare."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from resfl_lightning.analysis import compare, run_data
from resfl_lightning.attacks.base import attack_due
from resfl_lightning.attacks.byzantine import choose_attackers
from resfl_lightning.attacks.privacy_attacks import PrivacyAttacks
from resfl_lightning.attacks.registry import AttackOptions, build_attack_callbacks, read_attacks
from resfl_lightning.attacks.robustness import ByzantineUpdate, PoisonedData
from resfl_lightning.attacks.robustness_attacks import ByzantineAttack, DataPoisoning, EqualizedOdds
from resfl_lightning.attacks.scores import AttackScores
from resfl_lightning.attacks.settings import ByzantineSettings, MiaSettings, PoisoningSettings
from resfl_lightning.attacks.targets import isolated_rng, sample_members, split_reserve
from resfl_lightning.attacks.update_aia_attack import UpdateAttributeInference
from resfl_lightning.cli.compare import main as compare_main
from resfl_lightning.config import ConfigError
from resfl_lightning.data.detection import Annotations, ArrayImages
from resfl_lightning.data.federated import FederatedDetectionData
from resfl_lightning.data.partition import image_groups, make_federated_splits
from resfl_lightning.metrics.eod import classification_eod, detection_eod
from resfl_lightning.train import CONF_DIR


def compose_cfg(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides))


# --- EOD ------------------------------------------------------------------------------------------------------
def _box(x0, y0, x1, y1):
    return [float(x0), float(y0), float(x1), float(y1)]


def test_detection_eod_hand_computed():
    # Image A: persons g2 (hit), g0 (missed); one stray detection -> FP image for both sides.
    # Image B: persons g2 (missed), g1 (hit); no stray detection.
    # Image C: person g0 (hit) + a stray detection below tau (ignored) -> no FP.
    # Image D: person g1 (hit), a stray detection -> FP image (unprotected side only).
    pairs = [
        ({"boxes": torch.tensor([_box(0, 0, 10, 10), _box(50, 50, 60, 60)]), "scores": torch.tensor([0.9, 0.8]),
          "labels": torch.tensor([0, 0])},
         {"boxes": torch.tensor([_box(0, 0, 10, 10), _box(20, 20, 30, 30)]), "labels": torch.tensor([0, 0]),
          "groups": torch.tensor([2, 0])}),
        ({"boxes": torch.tensor([_box(20, 20, 30, 30)]), "scores": torch.tensor([0.7]), "labels": torch.tensor([0])},
         {"boxes": torch.tensor([_box(0, 0, 10, 10), _box(20, 20, 30, 30)]), "labels": torch.tensor([0, 0]),
          "groups": torch.tensor([2, 1])}),
        ({"boxes": torch.tensor([_box(0, 0, 10, 10), _box(40, 40, 45, 45)]), "scores": torch.tensor([0.9, 0.1]),
          "labels": torch.tensor([0, 0])},
         {"boxes": torch.tensor([_box(0, 0, 10, 10)]), "labels": torch.tensor([0]), "groups": torch.tensor([0])}),
        ({"boxes": torch.tensor([_box(0, 0, 10, 10), _box(40, 40, 50, 50)]), "scores": torch.tensor([0.9, 0.6]),
          "labels": torch.tensor([0, 0])},
         {"boxes": torch.tensor([_box(0, 0, 10, 10)]), "labels": torch.tensor([0]), "groups": torch.tensor([1])}),
    ]
    out = detection_eod(pairs, num_groups=3, protected_group=2)
    # protected g2: persons A(hit), B(miss) -> TPR 1/2; images A (FP), B (no FP) -> FPR 1/2
    # rest: persons A-g0 miss, B-g1 hit, C-g0 hit, D-g1 hit -> TPR 3/4; images A(FP), B, C, D(FP) -> FPR 2/4
    assert out["tpr_protected"] == pytest.approx(0.5)
    assert out["fpr_protected"] == pytest.approx(0.5)
    assert out["tpr_unprotected"] == pytest.approx(0.75)
    assert out["fpr_unprotected"] == pytest.approx(0.5)
    assert out["eod"] == pytest.approx(0.25)
    # Only group 1 as the unprotected side: persons B-g1 hit, D-g1 hit -> 1; images B, D(FP) -> 1/2
    one = detection_eod(pairs, num_groups=3, protected_group=2, unprotected_group=1)
    assert one["tpr_unprotected"] == pytest.approx(1.0) and one["fpr_unprotected"] == pytest.approx(0.5)
    assert one["eod"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="protected"):
        detection_eod(pairs[2:3], num_groups=3, protected_group=2)


def test_classification_eod_hand_computed():
    y = [1, 1, 0, 0, 1, 1, 0, 0, 1]
    yhat = [1, 0, 1, 0, 1, 1, 0, 0, 0]
    g = [0, 0, 0, 0, 1, 1, 1, 1, -1]
    out = classification_eod(y, yhat, g, num_groups=2, protected_group=0)
    assert out == pytest.approx({"eod": 0.5 + 0.5, "tpr_protected": 0.5, "tpr_unprotected": 1.0,
                                 "fpr_protected": 0.5, "fpr_unprotected": 0.0})


# --- settings and config groups ----------------------------------------------------------------------------------
def attack_settings(cfg) -> dict:
    """Every configured attack's checked settings, by its key under `attack`."""
    return {a.name: a.settings for a in read_attacks(cfg.attack)[1]}


MIA = "resfl_lightning.attacks.privacy_attacks.MembershipInference"
AIA = "resfl_lightning.attacks.privacy_attacks.AttributeInference"
BYZANTINE = "resfl_lightning.attacks.robustness_attacks.ByzantineAttack"


def test_attack_settings_validation():
    options, attacks = read_attacks({"enabled": ["mia"], "mia": {"_target_": MIA, "shadow_member_fraction": 0.5},
                                     "aia": {"_target_": AIA, "probe": {"epochs": 3}}})
    s = {a.name: a.settings for a in attacks}
    assert options.enabled == ["mia"] and options.every is None
    assert s["mia"].shadow_member_fraction == 0.5 and s["aia"].probe.epochs == 3 and s["aia"].probe.hidden == 128
    with pytest.raises(ConfigError, match=r"attack\.mia\.shadow_fraction: "):
        read_attacks({"mia": {"_target_": MIA, "shadow_fraction": 0.5}})
    with pytest.raises(ConfigError, match=r"attack\.aia\.probe\.epochs: .*Integer"):
        read_attacks({"aia": {"_target_": AIA, "probe": {"epochs": "many"}}})
    with pytest.raises(ConfigError, match=r"attack\.byzantine\.fraction: .*Float"):
        read_attacks({"byzantine": {"_target_": BYZANTINE, "fraction": "half"}})
    with pytest.raises(ConfigError, match=r"attack\.byzantine\.gamma: must be > 0"):
        read_attacks({"byzantine": {"_target_": BYZANTINE, "gamma": 0}})
    with pytest.raises(ConfigError, match=r"attack\.dp\._target_: cannot import"):
        read_attacks({"dp": {"_target_": "resfl_lightning.attacks.privacy_attacks.NoSuchAttack"}})
    with pytest.raises(ConfigError, match=r"attack\.dp\._target_: .* is not an Attack"):
        read_attacks({"dp": {"_target_": "resfl_lightning.attacks.scores.AttackScores"}})
    with pytest.raises(ConfigError, match=r"attack\.byzantin: neither an attack"):
        read_attacks({"byzantin": {"fraction": 0.5}})
    with pytest.raises(ConfigError, match=r"attack\.every: must be null or >= 1"):
        read_attacks({"every": 0})
    assert read_attacks(None) == (AttackOptions(), [])  # a config without an attack node runs none
    assert attack_due(9, 10, None) and not attack_due(3, 10, None)
    assert attack_due(3, 10, 2) and not attack_due(2, 10, 2)


def test_enabled_filters_the_configured_attacks():
    names = [type(c).__name__ for c in build_attack_callbacks(compose_cfg("attack=all", "attack.enabled=[mia,eod]"))]
    assert names == ["PrivacyAttacks", "EqualizedOdds", "AttackScores"]
    privacy = build_attack_callbacks(compose_cfg("attack=privacy", "attack.enabled=[aia]"))[0]
    assert privacy.mia is None and privacy.aia is not None
    assert build_attack_callbacks(compose_cfg("attack=privacy", "attack.enabled=[]")) == []
    with pytest.raises(ConfigError, match=r"attack\.enabled: \['byzantine'\] not configured"):
        build_attack_callbacks(compose_cfg("attack=privacy", "attack.enabled=[mia,byzantine]"))
    # EOD's null protected group is the poisoning target; without poisoning it is chosen from the data at fit start
    # (the smallest group: tests/unit/attacks/test_eod_protected_default.py)
    built = build_attack_callbacks(compose_cfg("attack=clean", "attack.eod.protected_group=null"))
    assert [c.protected for c in built if type(c).__name__ == "EqualizedOdds"] == [None]


@pytest.mark.parametrize("groups", ["[privacy,byzantine]", "[byzantine,privacy]", "[clean,poisoning]"])
def test_attack_groups_combine(groups):
    cfg = compose_cfg(f"attack={groups}", "attack.byzantine.fraction=0.5" if "byzantine" in groups else "seed=0")
    expected = {"[privacy,byzantine]": [ByzantineAttack, PrivacyAttacks, UpdateAttributeInference, EqualizedOdds],
                "[byzantine,privacy]": [ByzantineAttack, PrivacyAttacks, UpdateAttributeInference, EqualizedOdds],
                "[clean,poisoning]": [DataPoisoning, EqualizedOdds]}[groups]
    callbacks = build_attack_callbacks(cfg)
    assert [type(c) for c in callbacks] == [*expected, AttackScores]  # the order does not follow the selection's
    if "byzantine" in groups:
        assert callbacks[0].settings.fraction == 0.5


@pytest.mark.parametrize("group, expected", [
    ("none", []),
    ("clean", [EqualizedOdds, AttackScores]),
    ("privacy", [PrivacyAttacks, UpdateAttributeInference, EqualizedOdds, AttackScores]),
    ("byzantine", [ByzantineAttack, EqualizedOdds, AttackScores]),
    ("poisoning", [DataPoisoning, EqualizedOdds, AttackScores]),
    ("all", [ByzantineAttack, DataPoisoning, PrivacyAttacks, UpdateAttributeInference, EqualizedOdds, AttackScores]),
])
def test_attack_groups_select_callbacks(group, expected):
    cfg = compose_cfg(f"attack={group}", "logger=none")
    assert [type(c) for c in build_attack_callbacks(cfg)] == expected


def test_all_group_merges_every_setting():
    cfg = compose_cfg("attack=all", "attack.poisoning.target_group=1")
    s = attack_settings(cfg)
    assert s["byzantine"].gamma == 1.0 and s["poisoning"].mode == "drop" and s["mia"].calibration == "sigmoid"
    assert s["eod"].protected_group is None  # all.yaml: EOD measures the poisoned group
    eod = next(c for c in build_attack_callbacks(cfg) if isinstance(c, EqualizedOdds))
    assert eod.protected == s["poisoning"].target_group == 1


# --- tiny in-memory detection data -------------------------------------------------------------------------------
def tiny_detection_data(n_images: int = 40, size: int = 32, seed: int = 0) -> FederatedDetectionData:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 255, size=(n_images, size, size, 3), dtype=np.uint8)
    rows = []
    for i in range(n_images):
        for k in range(3):  # three persons per image, groups rotate through -1, 0, 1, 2
            rows.append((i, (i + k) % 4 - 1, 0.2 + 0.3 * k))
    idx, groups, cx = (np.array(c) for c in zip(*rows))
    boxes = np.stack([cx, np.full_like(cx, 0.5), np.full_like(cx, 0.2), np.full_like(cx, 0.4)], 1)
    ann = Annotations(idx, np.zeros(len(idx)), boxes, groups, np.zeros(len(idx)))
    source = ArrayImages(images, ann)
    splits = make_federated_splits(image_groups(ann.image_index, ann.groups, n_images), num_clients=4,
                                   test_fraction=0.2, reserve_fraction=0.3, seed=seed)
    return FederatedDetectionData(source=source, splits=splits, num_groups=3, num_classes=1, batch_size=4,
                                  image_size=None, augment=False)


def test_reserve_split_and_members_are_disjoint_and_reproducible():
    data = tiny_detection_data()
    g = image_groups(data.source.annotations.image_index, data.source.annotations.groups, len(data.source))
    a = split_reserve(data.splits.reserve, g, MiaSettings(), seed=3)
    b = split_reserve(data.splits.reserve, g, MiaSettings(), seed=3)
    parts = [a.shadow_members, a.shadow_nonmembers, a.target_nonmembers]
    assert all(np.array_equal(x, y) for x, y in zip(parts, [b.shadow_members, b.shadow_nonmembers,
                                                            b.target_nonmembers]))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.sort(data.splits.reserve))
    assert [len(p) for p in parts] == [4, 4, 4]
    members = sample_members(data, len(a.target_nonmembers), seed=3)
    train = np.concatenate([c.train for c in data.splits.clients])
    assert np.isin(members, train).all() and len(np.unique(members)) == len(a.target_nonmembers)
    assert not np.isin(members, data.splits.reserve).any()
    assert np.array_equal(members, sample_members(data, len(a.target_nonmembers), seed=3))


def test_isolated_rng_leaves_the_run_streams_untouched():
    torch.manual_seed(5)
    np.random.seed(5)
    expected = (torch.rand(3), np.random.rand(3))
    torch.manual_seed(5)
    np.random.seed(5)
    with isolated_rng():
        torch.manual_seed(99)
        np.random.seed(99)
        torch.rand(10), np.random.rand(10)
    torch.testing.assert_close(torch.rand(3), expected[0])
    np.testing.assert_array_equal(np.random.rand(3), expected[1])


# --- Byzantine --------------------------------------------------------------------------------------------------
def test_byzantine_update_flips_only_attackers_and_only_parameters():
    settings = ByzantineSettings(fraction=0.5, gamma=3.0)
    mask = torch.tensor([True, True, False, True])  # entry 2 is a BatchNorm running statistic
    t = ByzantineUpdate(4, settings, seed=7, mask=mask)
    delta = torch.tensor([1.0, -2.0, 0.5, 4.0])
    for r in range(3):
        attackers = choose_attackers(4, 0.5, 7, r)
        assert t.attackers(r) == attackers and len(attackers) == 2
        for cid in range(4):
            out = t(cid, r, delta)
            if cid in attackers:
                torch.testing.assert_close(out, torch.tensor([-3.0, 6.0, 0.5, -12.0]))
            else:
                assert out is delta
    bounded = ByzantineUpdate(4, ByzantineSettings(fraction=1.0, gamma=1.0, l2_bound=1.0), seed=0)
    out = bounded(0, 0, torch.tensor([3.0, 4.0]))
    torch.testing.assert_close(out, torch.tensor([-0.6, -0.8]))


class _Recorder:
    """Spy: the (transformed) update of every client as it reaches the aggregator, and the round's weights."""

    def __init__(self):
        self.deltas, self.weights, self.theta0, self.theta1 = {}, None, None, None

    def on_fit_start(self, state):
        self.theta0 = state.theta.clone()

    def on_client_end(self, report, delta):
        self.deltas[report.client_id] = delta.clone()

    def on_round_end(self, weights, state):
        self.weights, self.theta1 = dict(weights), state.theta.clone()


def _one_round(tmp_path, name, *overrides):
    from resfl_lightning.builders import build_run

    base = ["logger=none", "progress=false", "model.scale=femto", "dataset.num_images=40", "dataset.image_size=64",
            "dataset.extra_reserve_images=0", f"dataset.cache_dir={tmp_path / 'cache'}", "federation.rounds=1",
            "eval.every=100", f"run_dir={tmp_path / name}", *overrides]
    cfg = compose_cfg(*{o.split("=", 1)[0]: o for o in base}.values())  # a later override of a key replaces it
    job = build_run(cfg)
    spy = _Recorder()
    job.federation.fabric._callbacks.append(spy)
    job.fit()
    torch.set_num_threads(1)
    return spy, job.federation


def test_byzantine_updates_reach_the_aggregator_sign_flipped(tmp_path):
    clean, _ = _one_round(tmp_path, "clean", "attack=clean")
    attacked, fed = _one_round(tmp_path, "byz", "attack=byzantine", "attack.byzantine.fraction=0.5",
                               "attack.byzantine.gamma=2.0", "attack.byzantine.schedule=per_round")
    attackers = choose_attackers(4, 0.5, 0, 0)
    assert len(attackers) == 2
    torch.testing.assert_close(clean.theta0, attacked.theta0)
    client = fed.client_factory()
    from resfl_lightning.federation.state import FlatLayout

    layout = FlatLayout.of(client)
    is_param = torch.cat([torch.full((s.numel(),), k in dict(client.named_parameters()))
                          for k, s in zip(layout.float_keys, layout.shapes)])
    for cid in range(4):
        c, a = clean.deltas[cid], attacked.deltas[cid]
        if cid in attackers:
            torch.testing.assert_close(a[is_param], -2.0 * c[is_param])
            torch.testing.assert_close(a[~is_param], c[~is_param])  # BN running stats are not flipped by default
            assert float(c[is_param].abs().max()) > 0
        else:
            torch.testing.assert_close(a, c)
    # The global step is the weighted mean of exactly these (flipped) updates.
    step = sum(attacked.weights[cid] * attacked.deltas[cid].double() for cid in range(4))
    torch.testing.assert_close((attacked.theta1.double() - attacked.theta0.double()), step, atol=1e-6, rtol=1e-5)


# --- privacy per weather condition ---------------------------------------------------------------------------------
def test_weather_rows_rerun_the_attacks_on_corrupted_attack_images(tmp_path, monkeypatch):
    import resfl_lightning.attacks.privacy as privacy_module
    from resfl_lightning.data.weather import WEATHER_CONDITIONS

    requested: list[tuple[str, int, tuple]] = []
    real_loader = privacy_module.weather_loader

    def recording_loader(data, indices, condition, intensity, seed=0):
        requested.append((condition, int(intensity), tuple(np.asarray(indices).tolist())))
        return real_loader(data, indices, condition, intensity, seed)

    monkeypatch.setattr(privacy_module, "weather_loader", recording_loader)
    _, fed = _one_round(tmp_path, "wp", "attack=privacy", "attack.enabled=[mia,aia]", "dataset.extra_reserve_images=24",
                        "eval.weather=true")
    cb = next(c for c in fed.fabric._callbacks if isinstance(c, PrivacyAttacks))
    plan = cb.plan
    attacked = {tuple(a.tolist()) for a in (plan.split.shadow_members, plan.split.shadow_nonmembers, plan.members,
                                            plan.split.target_nonmembers, fed.data.splits.reserve)}
    for condition, intensity in WEATHER_CONDITIONS:  # every attack input is loaded under every condition
        assert {ix for c, i, ix in requested if (c, i) == (condition, intensity)} == attacked

    rows = json.loads((tmp_path / "wp" / "weather.json").read_text())["conditions"]
    assert len(rows) == 13
    for row in rows:
        # Privacy Score from balanced accuracies (RESFL A.4.1), never from the AIA's top-1
        assert row["privacy_score"] == pytest.approx((row["mia_success_rate"] + row["aia_balanced_accuracy"]) / 2)
        assert {"aia_top1", "aia_macro_f1", "aia_chance_uniform", "aia_chance_majority"} <= set(row)
    final = [json.loads(line) for line in (tmp_path / "wp" / "metrics.jsonl").read_text().splitlines()][-1]
    clear = rows[0]
    assert (clear["condition"], clear["intensity"]) == ("clear", 0)
    # clear images are the clean images: the re-run attacks reproduce the clean-image numbers exactly
    assert clear["mia_success_rate"] == final["attack/mia_success_rate"]
    assert clear["mia_auc"] == final["attack/mia_auc"]
    assert clear["aia_top1"] == final["attack/aia_top1"]
    assert clear["aia_balanced_accuracy"] == final["attack/aia_balanced_accuracy"]
    assert clear["aia_chance_majority"] == final["attack/aia_chance_majority"]
    assert final["score/privacy"] == pytest.approx((clear["mia_success_rate"] + clear["aia_balanced_accuracy"]) / 2)
    assert clear["aia_n_samples"] == final["attack/aia_n_samples"]
    fog = next(r for r in rows if (r["condition"], r["intensity"]) == ("fog", 100))
    assert final["weather/fog_100/privacy_score"] == fog["privacy_score"]


# --- poisoning ----------------------------------------------------------------------------------------------------
def _rows(loader) -> list[tuple]:
    out = []
    for batch in loader:
        owner = batch["image_id"][batch["batch_idx"].long()]
        for i, c, b, g in zip(owner.tolist(), batch["cls"].reshape(-1).tolist(), batch["bboxes"].tolist(),
                              batch["groups"].tolist()):
            out.append((i, c, tuple(round(x, 6) for x in b), g))
    return sorted(out)


def test_poisoned_data_changes_only_poisoned_clients_target_rows_inside_the_block():
    base = tiny_detection_data()
    settings = PoisoningSettings(fraction=0.5, target_group=2, mode="drop", start_round=1, length=2)
    data = PoisonedData(base, settings, seed=0, rounds=5)
    assert len(data.clients) == 2
    assert data.num_clients == base.num_clients and data.splits is base.splits  # everything else is delegated
    for r in range(5):
        data.set_round(r)
        for cid in range(4):
            clean, seen = _rows(base.train_loader(cid, seed=11)), _rows(data.train_loader(cid, seed=11))
            if cid in data.clients and 1 <= r < 3:
                assert [x for x in clean if x[3] != 2] == seen  # every other row bit-identical
                assert any(x[3] == 2 for x in clean) and not any(x[3] == 2 for x in seen)
            else:
                assert clean == seen
    data.set_round(1)
    victim = data.clients[0]
    summary = data.poisoned(victim)[1]
    assert summary["n_poisoned"] == summary["n_target_rows"] > 0
    # Validation, test and reserve loaders are never poisoned.
    assert _rows(data.val_loader(victim)) == _rows(base.val_loader(victim))
    assert _rows(data.reserve_loader()) == _rows(base.reserve_loader())


def test_poisoned_data_relabel_group_and_config_errors():
    base = tiny_detection_data()
    data = PoisonedData(base, PoisoningSettings(fraction=0.25, target_group=2, mode="relabel_group", other_group=0),
                        seed=1, rounds=3)
    cid = data.clients[0]
    clean, seen = _rows(base.train_loader(cid, 3)), _rows(data.train_loader(cid, 3))
    assert len(clean) == len(seen)
    assert [x for x in seen if x[3] == 2] == []
    assert sorted((x[0], x[2]) for x in clean if x[3] == 2) == sorted(
        (x[0], x[2]) for x in seen if x not in clean and x[3] == 0)
    with pytest.raises(ConfigError, match="mislabel_class"):
        PoisonedData(base, PoisoningSettings(mode="mislabel", mislabel_class=1), seed=0, rounds=3)
    with pytest.raises(ConfigError, match="target_group"):
        PoisonedData(base, PoisoningSettings(target_group=3), seed=0, rounds=3)


# --- scores -------------------------------------------------------------------------------------------------------
class _Fed:
    class fabric:  # noqa: N801 - a stand-in for Fabric's rank flag
        is_global_zero = True


def test_attack_scores():
    metrics = {"attack/mia_success_rate": 0.6, "attack/aia_success_rate": 0.5, "test/abs_one_minus_di": 0.2,
               "test/delta_eop": 0.1}
    AttackScores().on_round_end(_Fed, metrics)
    assert metrics["score/privacy"] == pytest.approx(0.55)
    assert metrics["score/fairness"] == pytest.approx(0.15)
    only_update = {"attack/mia_success_rate": 0.7, "attack/update_aia_success_rate": 0.9,
                   "test/abs_one_minus_di": math.nan, "test/delta_eop": 0.1}
    AttackScores().on_round_end(_Fed, only_update)
    # |1-DI| undefined this round: the score is written as NaN, so no earlier round's score can stand for this one
    assert only_update["score/privacy"] == pytest.approx(0.8) and math.isnan(only_update["score/fairness"])
    no_eval = {"attack/mia_success_rate": 0.7}  # no evaluation and no AIA this round: no scores at all
    AttackScores().on_round_end(_Fed, no_eval)
    assert "score/fairness" not in no_eval and math.isnan(no_eval["score/privacy"])


# --- compare --------------------------------------------------------------------------------------------------------
def _run_dir(path, summary, seed=0):
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps(summary))
    (path / ".hydra").mkdir()
    (path / ".hydra" / "config.yaml").write_text(f"seed: {seed}\ndataset:\n  name: synthetic\n")
    return path


def test_compare_hand_computed(tmp_path, capsys):
    clean = _run_dir(tmp_path / "clean", {"test/map": 0.40, "test/map_50": 0.80, "test/eod": 0.10,
                                          "test/delta_eop": 0.20})
    other = _run_dir(tmp_path / "other", {"test/map": 0.30, "test/map_50": 0.70, "test/eod": 0.25,
                                          "test/delta_eop": 0.10})
    assert compare_main([str(clean), str(other), "--fate-baseline"]) == 0
    result = json.loads((other / "comparison.json").read_text())
    m = result["metrics"]
    assert m["ba_ad"]["value"] == pytest.approx(0.25)
    assert m["ba_ad_50"]["value"] == pytest.approx(0.125)
    assert m["dpa_eodd"]["value"] == pytest.approx(0.15)
    assert m["fate"]["value"] == pytest.approx(10 * ((0.30 - 0.40) / 0.40 + (0.20 - 0.10) / 0.20))  # 10x: CurvFed
    assert result["warnings"] == []
    printed = capsys.readouterr().out
    assert "ba_ad" in printed and "0.2500" in printed and "0.1500" in printed


def test_compare_undefined_missing_and_mismatched(tmp_path, capsys):
    clean = _run_dir(tmp_path / "clean", {"test/map": 0.0})
    other = _run_dir(tmp_path / "other", {"test/map": 0.1, "test/eod": 0.3}, seed=1)
    result = compare.compare_runs(run_data.load_run(clean), run_data.load_run(other))
    assert result["metrics"]["ba_ad"]["value"] is None and "0" in result["metrics"]["ba_ad"]["reason"]
    assert result["metrics"]["dpa_eodd"]["value"] is None and "clean run" in result["metrics"]["dpa_eodd"]["reason"]
    assert any("seed" in w for w in result["warnings"])
    # metrics.jsonl fallback: last non-null value of each key
    jsonl = tmp_path / "jsonl"
    jsonl.mkdir()
    (jsonl / "metrics.jsonl").write_text(json.dumps({"round": 0, "test/map": 0.2}) + "\n"
                                         + json.dumps({"round": 1, "test/map": 0.1, "test/eod": None}) + "\n")
    assert run_data.load_run(jsonl).summary["test/map"] == 0.1
    assert compare_main([str(tmp_path / "missing"), str(other)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_eod_callback_rejects_groups_outside_the_dataset():
    fed = type("Fed", (), {"data": tiny_detection_data(n_images=12)})
    EqualizedOdds(2).on_fit_start(fed)
    with pytest.raises(ConfigError, match="protected_group=3"):
        EqualizedOdds(3).on_fit_start(fed)
    with pytest.raises(ConfigError, match="equals"):
        EqualizedOdds(1, 1).on_fit_start(fed)


def test_compare_classification_uses_accuracy(tmp_path):
    clean = _run_dir(tmp_path / "clean", {"test/accuracy": 0.80, "test/eod": 0.05})
    other = _run_dir(tmp_path / "other", {"test/accuracy": 0.60, "test/eod": 0.02})
    m = compare.compare_runs(run_data.load_run(clean), run_data.load_run(other))["metrics"]
    assert m["ba_ad"]["inputs"] == "test/accuracy" and m["ba_ad"]["value"] == pytest.approx(0.25)
    assert m["dpa_eodd"]["value"] == pytest.approx(-0.03) and "ba_ad_50" not in m


def test_compare_leaves_out_the_eod_change_of_a_run_that_detects_nothing(tmp_path):
    # the attacked detector scores no person >= the threshold: its EOD 0 is 0 - 0, not a fairness gain of the attack
    rates = {"test/tpr/0": 0.6, "test/tpr/1": 0.4}
    clean = _run_dir(tmp_path / "clean", {"test/map": 0.5, "test/eod": 0.2, "test/delta_eop": 0.2, **rates})
    blind = _run_dir(tmp_path / "blind", {"test/map": 0.3, "test/eod": 0.0, "test/delta_eop": 0.0,
                                          "test/tpr/0": 0.0, "test/tpr/1": 0.0})
    m = compare.compare_runs(run_data.load_run(clean), run_data.load_run(blind), fate_baseline=True)["metrics"]
    assert m["dpa_eodd"]["value"] is None and m["dpa_eodd"]["other"] == 0.0
    assert m["dpa_eodd"]["reason"].startswith("the other run detects nothing (test TPR 0 in all 2 groups")
    assert m["fate"]["value"] is None and "detects nothing" in m["fate"]["reason"]
    assert m["ba_ad"]["value"] == pytest.approx(0.4)  # utility still compares
    seeing = _run_dir(tmp_path / "seeing", {"test/map": 0.5, "test/eod": 0.1, "test/delta_eop": 0.1, **rates})
    assert compare.compare_runs(run_data.load_run(clean), run_data.load_run(seeing))["metrics"]["dpa_eodd"][
        "value"] == pytest.approx(-0.1)


def test_compare_privacy_score_from_balanced_accuracies(tmp_path):
    # score/privacy stored by an old run (top-1 AIA) must not leak in: the change is recomputed from the two SRs.
    clean = _run_dir(tmp_path / "clean", {"test/map": 0.4, "attack/mia_success_rate": 0.60,
                                          "attack/aia_balanced_accuracy": 0.40, "attack/aia_top1": 0.90,
                                          "score/privacy": 0.75})
    other = _run_dir(tmp_path / "other", {"test/map": 0.4, "attack/mia_success_rate": 0.55,
                                          "attack/aia_balanced_accuracy": 0.35})
    m = compare.compare_runs(run_data.load_run(clean), run_data.load_run(other))["metrics"]
    entry = m["privacy_score_change"]
    assert entry["clean"] == pytest.approx(0.50) and entry["other"] == pytest.approx(0.45)
    assert entry["value"] == pytest.approx(-0.05)
    bare = _run_dir(tmp_path / "bare", {"test/map": 0.3})  # neither run attacked for privacy: no entry at all
    same = compare.compare_runs(run_data.load_run(bare), run_data.load_run(bare))
    assert "privacy_score_change" not in same["metrics"]


def test_privacy_report_runs_one_byzantine_run_per_report_mode(tmp_path):
    from resfl_lightning.analysis.privacy_report import robustness_runs, run_overrides

    runs = robustness_runs(["honest", "sent", "lie"])
    assert [(name, key) for _, key, name, _ in runs] == [("byzantine", "ba_ad"), ("byzantine-sent", "ba_ad_sent"),
                                                         ("byzantine-lie", "ba_ad_lie"), ("poisoning", "dpa_eodd")]
    for attack, _, name, extra in runs:
        cmd = run_overrides("resfl", attack, tmp_path / name, ["federation.rounds=2", *extra])
        assert f"attack={attack}" in cmd and all(o in cmd for o in extra)
        mode = next((o.split("=")[1] for o in extra), None)
        cfg = compose_cfg(f"attack={attack}", *extra)
        assert mode is None or attack_settings(cfg)["byzantine"].report == mode
