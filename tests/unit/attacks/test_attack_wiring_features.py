"""Attack feature extraction on a tiny femto detector (and the tabular client): MIA features, ROI features for the
representation AIA, the shadow model, and the update-aware AIA callback."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch

from resfl_lightning.attacks.mia import DETECTION_FEATURE_NAMES
from resfl_lightning.attacks.outputs import (
    default_head_prefixes,
    detection_outputs,
    mia_features,
    representation_features,
)
from resfl_lightning.attacks.settings import UpdateAiaSettings
from resfl_lightning.attacks.targets import ShadowModel, client_dominant_group
from resfl_lightning.attacks.update_aia_attack import UpdateAttributeInference
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.detection import DetectionClient
from resfl_lightning.data.detection import ground_truth_for
from resfl_lightning.federation.orchestrator import FederationSettings
from resfl_lightning.federation.state import FlatLayout
from resfl_lightning.models.yolo import YoloSpec
from tests.unit.attacks.test_attack_wiring import tiny_detection_data


def make_client(seed: int = 0) -> DetectionClient:
    torch.manual_seed(seed)
    return DetectionClient(YoloSpec(num_classes=1, scale="femto", image_size=64), 3, LossWeights(), UfmSettings(),
                           OptimSettings())


def calibrated(client: DetectionClient, data, spread: float = 0.5) -> DetectionClient:
    """At init, BatchNorm running stats make eval-mode features ~0 and every anchor alike: set them from the data and
    spread the class evidence, so per-image outputs actually differ."""
    with torch.no_grad():
        for seq in client.model.detector.model[-1].cv3:
            seq[-1].weight.normal_(0.0, spread)
        for m in client.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.reset_running_stats()
                m.momentum = None  # cumulative average over the passes below
        client.train()
        for batch in data.loader_for(np.arange(len(data.source))):
            client.model(batch["img"])
    for m in client.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.momentum = 0.03
    return client


@pytest.fixture(scope="module")
def setup():
    data = tiny_detection_data(n_images=24, size=64)
    return calibrated(make_client(), data), data


def test_mia_features_shape_loss_and_detections(setup):
    client, data = setup
    idx = data.splits.reserve
    feats = mia_features(client, data.loader_for(idx), score_threshold=0.0)
    assert feats.shape == (len(idx), len(DETECTION_FEATURE_NAMES)) and np.isfinite(feats).all()
    # Columns 0-4 describe the post-NMS detections predict() returns at the same threshold.
    client.eval()
    single = dataclasses.replace(data, batch_size=1)
    for row, batch in zip(feats, single.loader_for(idx)):
        with torch.no_grad():
            out = client.model(batch["img"])
            pred = client.model.predict(out, conf=0.0, iou=client.ufm.iou_threshold, max_det=client.max_det)[0]
            loss = float(client.criterion.compute(out, batch).task)
        assert row[0] == len(pred["scores"]) > 0
        assert row[1] == pytest.approx(float(pred["scores"].mean()), rel=1e-5)
        assert row[2] == pytest.approx(float(pred["scores"].max()), rel=1e-5)
        assert row[3] == pytest.approx(float(pred["alpha0"].mean()), rel=1e-5)
        # The per-image loss does not depend on which images share the batch (eval mode, per-image slicing).
        assert row[5] == pytest.approx(loss, rel=1e-4)
    client.train()


def test_logit_margin_matches_an_independent_computation(setup):
    client, data = setup
    loader = dataclasses.replace(data, batch_size=1).loader_for(data.splits.reserve[:3])
    out_all = detection_outputs(client, loader, score_threshold=0.0)
    none = detection_outputs(client, loader, score_threshold=0.999)
    client.eval()
    for k, batch in enumerate(loader):
        with torch.no_grad():
            out = client.model(batch["img"])
            dec = client.model.decode(out)
        alpha = dec["alpha"][0]  # (A, 2): person, background
        margin = alpha[:, 0].log() - alpha[:, 1].log()
        # With detections: mean margin over the anchors whose decoded box and score predict() returned.
        pred = out_all["preds"][k]
        score = alpha[:, 0] / alpha.sum(-1)
        boxes = dec["boxes"][0].clamp(min=0).clamp(max=64.0)  # predict() clips boxes to the 64 x 64 image
        anchors = [int(torch.argmin((boxes - b).abs().sum(-1) + 1e3 * (score - s).abs())) for b, s in
                   zip(pred["boxes"], pred["scores"])]
        assert len(set(anchors)) == len(anchors)
        assert len(anchors) > 1 and float(margin[anchors].std()) > 1e-2
        assert out_all["margins"][k] == pytest.approx(float(margin[anchors].mean()), rel=1e-4, abs=1e-5)
        # Without detections (tau above every score): the margin of the best-scoring anchor.
        assert len(none["preds"][k]["scores"]) == 0
        assert none["margins"][k] == pytest.approx(float(margin[int(score.argmax())]), rel=1e-4, abs=1e-5)
    client.train()


class _Tracking:
    """A loader that remembers the batch being processed (for the stand-in predict)."""

    def __init__(self, loader):
        self.loader, self.batch = loader, None

    def __iter__(self):
        for batch in self.loader:
            self.batch = batch
            yield batch


def test_representation_features_ground_truth_and_matched(setup, monkeypatch):
    client, data = setup
    loader = _Tracking(data.loader_for(data.splits.reserve))
    ann = data.source.annotations
    n_known = int(((ann.groups >= 0) & np.isin(ann.image_index, data.splits.reserve)).sum())
    # Reference: person_features at every ground-truth box, known groups only.
    ref_f, ref_g = [], []
    client.eval()
    with torch.no_grad():
        for batch in data.loader_for(data.splits.reserve):
            f = client.person_features(client.model(batch["img"])["feats"], batch)
            known = batch["groups"] >= 0
            ref_f.append(f[known])
            ref_g.append(batch["groups"][known])
    client.train()
    ref_f, ref_g = torch.cat(ref_f).numpy(), torch.cat(ref_g).numpy()
    feat_dim = sum(client.model.feature_channels)

    # An untrained model matches no person at tau = 0.25: the probe falls back to the ground-truth boxes.
    gt = representation_features(client, loader, boxes="matched", score_threshold=0.25, min_matched=5)
    assert gt["source"] == "ground_truth" and gt["features"].shape == (n_known, feat_dim)
    np.testing.assert_allclose(gt["features"], ref_f, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(gt["groups"], ref_g)

    # A detector that finds every person exactly (plus one stray box): ROIs at the matched detections.
    def perfect_predict(out, conf, iou, max_det):
        preds = []
        for g in ground_truth_for(loader.batch):
            boxes = torch.cat([g["boxes"], torch.tensor([[1.0, 1.0, 5.0, 5.0]])])
            n = len(boxes)
            preds.append({"boxes": boxes, "scores": torch.linspace(0.9, 0.5, n), "labels": torch.zeros(n).long(),
                          "alpha0": torch.ones(n), "u_cls": torch.ones(n), "u_box": torch.ones(n)})
        return preds

    monkeypatch.setattr(client.model, "predict", perfect_predict)
    matched = representation_features(client, loader, boxes="matched", score_threshold=0.25, min_matched=5)
    assert matched["source"] == "matched" and matched["n_matched"] == n_known
    np.testing.assert_allclose(matched["features"], ref_f, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(matched["groups"], ref_g)


def _fake_federation(data, tmp_path, rounds=2, factory=make_client):
    fabric = L.Fabric(accelerator="cpu", devices=1)
    return SimpleNamespace(fabric=fabric, data=data, client_factory=factory,
                           settings=FederationSettings(rounds=rounds, local_epochs=1, run_dir=tmp_path),
                           own_clients=lambda: list(range(data.num_clients)))


def test_shadow_model_is_incremental_deterministic_and_rng_neutral(setup, tmp_path):
    _, data = setup
    fed = _fake_federation(data, tmp_path)
    members = data.splits.reserve[:6]
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    stepwise = ShadowModel(fed, members, seed=5)
    stepwise.advance(1)
    after_one = FlatLayout.of(stepwise.client).flatten(stepwise.client).clone()
    stepwise.advance(2)
    torch.testing.assert_close(torch.rand(4), expected)  # the run's RNG stream is untouched
    direct = ShadowModel(fed, members, seed=5)
    direct.advance(2)
    layout = FlatLayout.of(direct.client)
    assert stepwise.rounds_done == direct.rounds_done == 2
    torch.testing.assert_close(layout.flatten(stepwise.client), layout.flatten(direct.client))
    init = layout.flatten(make_client(0))
    assert not torch.equal(after_one, layout.flatten(direct.client))
    assert not torch.equal(init, after_one)


def _run_update_aia(fed, client, rounds, monkeypatch, labels=None):
    """Drive the update-aware AIA callback through `rounds` rounds of random real updates; returns the callback, the
    metrics and the (train, test) arrays handed to the probe."""
    import resfl_lightning.attacks.update_aia as update_aia
    import resfl_lightning.attacks.update_aia_attack as callback_module

    if labels is not None:  # evaluation ground truth the test controls: which dominant group each real client has
        monkeypatch.setattr(callback_module, "real_client_labels", lambda data: dict(labels))
    probe_inputs = []
    real_probe = update_aia.train_test_attribute_probe

    def spy(train_x, train_y, test_x, test_y, *args, **kwargs):
        probe_inputs.append((np.array(train_x), np.array(train_y), np.array(test_x), np.array(test_y)))
        return real_probe(train_x, train_y, test_x, test_y, *args, **kwargs)

    monkeypatch.setattr(update_aia, "train_test_attribute_probe", spy)
    settings = UpdateAiaSettings(top_k=50, shadow_clients=3, shadow_client_size=4, min_samples=8)
    cb = UpdateAttributeInference(settings, seed=0)
    layout = FlatLayout.of(client)
    theta = layout.flatten(client)
    state = SimpleNamespace(theta=theta, int_buffers=layout.int_buffers(client), extra={})
    cb.on_fit_start(fed, client, layout, state)
    gen = torch.Generator().manual_seed(0)
    metrics: dict = {}
    for r in range(rounds):
        for cid in range(4):
            cb.on_client_end(fed, r, SimpleNamespace(client_id=cid), 1e-3 * torch.randn(layout.numel, generator=gen))
        state = SimpleNamespace(theta=theta + 1e-3 * torch.randn(layout.numel, generator=gen),
                                int_buffers=state.int_buffers, extra=state.extra)
        cb.on_round_end(fed, r, layout, state, metrics)
    return cb, metrics, probe_inputs


def test_update_aia_probe_trains_on_shadow_updates_and_tests_on_real_ones(setup, tmp_path, monkeypatch):
    client, data = setup
    fed = _fake_federation(data, tmp_path, rounds=3)
    cb, metrics, probe_inputs = _run_update_aia(fed, client, 3, monkeypatch, labels={0: 0, 1: 1, 2: 2, 3: 0})
    assert cb.prefixes == default_head_prefixes(client) == ["model.detector.model.22.", "model.nig."]
    assert cb.applicable and len(cb.real_rows) == 12 and len(cb.shadow_rows) == 9  # 4 real, 3 shadow clients x 3 rounds
    assert [lab for *_, lab in cb.shadow_rows[:3]] == cb.shadow.labels
    assert metrics["attack/update_aia_applicable"] == 1.0 and 0 <= metrics["attack/update_aia_balanced_accuracy"] <= 1
    (train_x, train_y, test_x, test_y), = probe_inputs
    real_x = np.stack([r[2] for r in cb.real_rows])
    # The probe never sees a real client's update while training: none of its training rows is a real update,
    # every one is a shadow client's, and the real updates are exactly its test set.
    assert not any(np.isclose(real_x, row, rtol=0, atol=1e-7).all(axis=1).any() for row in train_x)
    np.testing.assert_array_equal(train_x, np.stack([r[2] for r in cb.shadow_rows]))
    np.testing.assert_array_equal(np.sort(test_x, axis=0), np.sort(real_x, axis=0))
    np.testing.assert_array_equal(np.sort(test_y), np.sort([r[3] for r in cb.real_rows]))
    assert metrics["attack/update_aia_n_samples"] == 12 and metrics["attack/update_aia_n_shadow_samples"] == 9
    saved = json.loads((tmp_path / "attacks" / "update_aia_round_0002.json").read_text())
    assert {s["shadow_client"] for s in saved["train_samples"]} == {-1, -2, -3}
    assert {s["client"] for s in saved["test_samples"]} == {0, 1, 2, 3}


def test_update_aia_is_not_applicable_when_every_client_has_the_same_dominant_group(setup, tmp_path, monkeypatch):
    client, data = setup
    fed = _fake_federation(data, tmp_path, rounds=2)
    for cid in range(4):  # the real labels of this data (tiny IID shards)
        groups = data.source.annotations.groups[np.isin(data.source.annotations.image_index,
                                                        data.splits.clients[cid].train)]
        assert client_dominant_group(data, cid) == np.bincount(groups[groups >= 0]).argmax()
    cb, metrics, probe_inputs = _run_update_aia(fed, client, 2, monkeypatch, labels={0: 1, 1: 1, 2: 1, 3: 1})
    assert not cb.applicable and cb.shadow is None and cb.shadow_rows == [] and probe_inputs == []
    assert metrics["attack/update_aia_applicable"] == 0.0 and metrics["attack/update_aia_n_labels"] == 1
    assert np.isnan(metrics["attack/update_aia_balanced_accuracy"])  # not a "chance rate of 1.0"
    assert np.isnan(metrics["attack/update_aia_success_rate"])


def test_tabular_client_features():
    tabular = pytest.importorskip("resfl_lightning.clients.tabular")

    from resfl_lightning.data.tabular import federated_tabular_data

    rng = np.random.default_rng(0)
    n, f = 200, 6
    x, y, s = rng.normal(size=(n, f)).astype(np.float32), rng.integers(0, 2, n), rng.integers(0, 2, n)
    splits = {"num_clients": 2, "reserve_fraction": 0.2,
              "val_fraction": 0.1, "partition": "iid", "dirichlet_alpha": 0.5, "batch_size": 16}
    data = federated_tabular_data(x[:150], y[:150], s[:150], x[150:], y[150:], s[150:], num_groups=2, **splits,
                                  seed=0)
    torch.manual_seed(0)
    client = tabular.TabularClient(f, 2, LossWeights(), UfmSettings(), OptimSettings(), hidden=(16, 8))
    feats = mia_features(client, data.loader_for(data.splits.reserve))
    assert feats.shape == (len(data.splits.reserve), 7) and np.isfinite(feats).all()
    rep = representation_features(client, data.loader_for(data.splits.reserve))
    assert rep["features"].shape == (len(data.splits.reserve), 8) and rep["source"] == "penultimate"
    np.testing.assert_array_equal(rep["groups"], s[data.splits.reserve])
    assert default_head_prefixes(client) == ["model.head."]


def test_tabular_poisoning_drop_and_mislabel():
    pytest.importorskip("resfl_lightning.clients.tabular")

    from resfl_lightning.attacks.robustness import PoisonedData
    from resfl_lightning.attacks.settings import PoisoningSettings
    from resfl_lightning.data.tabular import federated_tabular_data

    rng = np.random.default_rng(1)
    n = 300
    x, y, s = rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 2, n), rng.integers(0, 3, n)
    splits = {"num_clients": 4, "reserve_fraction": 0.1,
              "val_fraction": 0.1, "partition": "iid", "dirichlet_alpha": 0.5, "batch_size": 16}
    base = federated_tabular_data(x[:250], y[:250], s[:250], x[250:], y[250:], s[250:], num_groups=3, **splits, seed=0)

    def rows(loader):
        return sorted((int(i), int(yy), int(g)) for b in loader for i, yy, g in zip(b["index"], b["y"], b["groups"]))

    for mode, extra in (("drop", {}), ("mislabel", {"mislabel_class": 0})):
        data = PoisonedData(base, PoisoningSettings(fraction=0.5, target_group=1, mode=mode, **extra), seed=0,
                            rounds=2)
        for cid in range(4):
            clean, seen = rows(base.train_loader(cid, 5)), rows(data.train_loader(cid, 5))
            if cid not in data.clients:
                assert seen == clean
            elif mode == "drop":  # a shorter split reshuffles (and may drop a lone last row), so compare the split
                train = base.splits.clients[cid].train
                kept = data.poisoned(cid)[0].splits.clients[cid].train
                np.testing.assert_array_equal(kept, train[s[train] != 1])
                assert len(kept) < len(train) and set(seen) <= set(clean) and all(g != 1 for *_, g in seen)
            else:
                assert seen == [(i, 0 if g == 1 else yy, g) for i, yy, g in clean]
                assert any(yy == 1 and g == 1 for _, yy, g in clean)
        assert rows(data.test_loader()) == rows(base.test_loader())
