"""Weather evaluation: corrupting loader, 13-condition table, metadata grouping, metrics, plot, callback, finetune."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import WandbLogger
from omegaconf import OmegaConf

from resfl_lightning.callbacks.weather import WeatherEvaluation
from resfl_lightning.config import ConfigError
from resfl_lightning.data.detection import Annotations, ArrayImages, DetectionDataset
from resfl_lightning.data.federated import FederatedDetectionData
from resfl_lightning.data.partition import make_federated_splits
from resfl_lightning.data.weather import WEATHER_CONDITIONS, WEATHER_INTENSITIES, apply_weather
from resfl_lightning.evaluation.weather import (
    WeatherImages,
    evaluate_weather,
    plot_weather,
    weather_loader,
    weather_metrics,
    weather_seed,
    write_weather_json,
)
from resfl_lightning.trained.finetune import (
    FinetuneSettings,
    finetune,
    finetune_indices,
    parameter_groups,
)
from resfl_lightning.trained.load import read_trained_config

REPO = Path(__file__).resolve().parents[3]


@dataclass
class MetaImages(ArrayImages):
    """ArrayImages plus CARLA-style per-image metadata."""

    image_meta: dict = field(default_factory=dict)


def _images(n: int, h: int = 48, w: int = 48, seed: int = 0) -> ArrayImages:
    """n random images, two boxes each (group = image index mod 3)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, h, w, 3), dtype=np.uint8)
    idx = np.repeat(np.arange(n), 2)
    boxes = np.tile([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.3, 0.4]], (n, 1))
    ann = Annotations(image_index=idx, cls=np.zeros(2 * n), boxes=boxes, groups=idx % 3, proxy=np.zeros(2 * n))
    return ArrayImages(images, ann)


def _data(source, image_size=None, num_clients=2, test_fraction=0.25, batch_size=4) -> FederatedDetectionData:
    groups = np.arange(len(source)) % 3
    splits = make_federated_splits(groups, num_clients=num_clients, test_fraction=test_fraction,
                                   reserve_fraction=0.0, val_fraction=0.2, seed=0)
    return FederatedDetectionData(source=source, splits=splits, num_groups=3, num_classes=1, batch_size=batch_size,
                                  image_size=image_size, augment=False)


class PixelModel:
    """Stands in for a detector: 'metrics' are statistics of the pixels it was shown (recorded per call)."""

    def __init__(self):
        self.seen: list[list[int]] = []

    def test_metrics(self, loader) -> dict[str, float]:
        imgs, ids = [], []
        for batch in loader:
            imgs.append(batch["img"])
            ids += batch["image_id"].tolist()
        self.seen.append(ids)
        x = torch.cat(imgs).double()
        return {"map": float(x.mean()), "map_50": float(x.std()), "fairness_score": float(x.max() - x.min())}


def test_wrapper_applies_apply_weather_per_image_and_keeps_annotations():
    src = _images(6)
    idx = np.array([4, 1, 5])
    clean = DetectionDataset(src, idx)
    foggy = DetectionDataset(WeatherImages(src, "fog", 50, seed=3), idx)
    for k, i in enumerate(idx):
        expected = apply_weather(src.images[i], "fog", 50, weather_seed(3, i))
        np.testing.assert_array_equal(foggy[k]["img"].permute(1, 2, 0).numpy(), expected)
        assert not np.array_equal(expected, src.images[i])
        for key in ("cls", "bboxes", "groups", "proxy"):
            assert torch.equal(foggy[k][key], clean[k][key])
        assert foggy[k]["image_id"] == clean[k]["image_id"] == i
    # Per-image seeds differ, so two images never share one random fog field.
    assert weather_seed(3, 4) != weather_seed(3, 1)


def test_weather_is_applied_before_letterbox_so_padding_stays_grey():
    src = _images(4, h=32, w=48)
    data = _data(src, image_size=48, num_clients=1, test_fraction=0.5)
    batch = next(iter(weather_loader(data, data.splits.test, "fog", 100, seed=0)))
    img = (batch["img"] * 255).round().to(torch.uint8)
    # 32x48 -> 48x48: 8 padded rows above and below the image keep the letterbox value 114.
    assert (img[:, :, :8] == 114).all() and (img[:, :, -8:] == 114).all()
    assert not (img[:, :, 8:-8] == 114).all()


@pytest.mark.parametrize("condition", ["clear", "rain"])
def test_intensity_zero_equals_clean_loader_bit_for_bit(condition):
    data = _data(_images(16))
    clean = list(data.test_loader())
    wrapped = list(weather_loader(data, data.splits.test, condition, 0, seed=7))
    assert len(clean) == len(wrapped) > 0
    for a, b in zip(clean, wrapped):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_table_has_13_rows_scored_on_independently_corrupted_images():
    src = _images(12)
    data = _data(src)
    model = PixelModel()
    rows = evaluate_weather(model, data, seed=5)
    assert [(r["condition"], r["intensity"]) for r in rows] == list(WEATHER_CONDITIONS)
    test = data.splits.test
    for r in rows:
        ref = np.stack([apply_weather(src.images[i], r["condition"], r["intensity"], weather_seed(5, i))
                        for i in test]).astype(np.float64) / 255.0
        assert r["n_images"] == len(test)
        assert r["map"] == pytest.approx(ref.mean(), rel=1e-6)
    assert rows[0]["map"] != rows[-1]["map"]  # fog 100 % is not the clear image
    assert all(sorted(seen) == sorted(test.tolist()) for seen in model.seen)


def _carla_like(n: int = 40):
    """Data whose source records weather per image; every condition appears in the test split."""
    base = _images(n)
    data = _data(MetaImages(base.images, base.annotations), test_fraction=0.5)
    cond = np.zeros(n, np.int64)
    cond[data.splits.test] = np.arange(len(data.splits.test)) % len(WEATHER_CONDITIONS)
    train = np.concatenate([c.train for c in data.splits.clients])
    cond[train[::2]] = 12  # fog 100 % among the training frames: fine-tuning must skip them
    data.source.image_meta = {"weather": np.array([WEATHER_CONDITIONS[c][0] for c in cond], dtype=object),
                              "intensity": np.array([WEATHER_CONDITIONS[c][1] for c in cond])}
    return data, cond


def test_metadata_mode_groups_real_frames_by_recorded_condition():
    data, cond = _carla_like()
    model = PixelModel()
    rows = evaluate_weather(model, data, mode="auto")
    test = data.splits.test
    for k, (row, seen) in enumerate(zip(rows, model.seen)):
        expected = sorted(test[cond[test] == k].tolist())
        assert sorted(seen) == expected and row["n_images"] == len(expected) > 0
        ref = data.source.images[expected].astype(np.float64) / 255.0  # real frames, not corrupted
        assert row["map"] == pytest.approx(ref.mean(), rel=1e-6)
    # finetune uses only the clear training frames
    train = np.sort(np.concatenate([c.train for c in data.splits.clients]))
    np.testing.assert_array_equal(finetune_indices(data), train[cond[train] == 0])


def test_metadata_mode_errors(tmp_path):
    data, cond = _carla_like()
    missing = data.splits.test[cond[data.splits.test] == 7]
    cb = WeatherEvaluation(tmp_path)
    cb.on_fit_start(_federation(data))  # every condition present: fine
    data.splits.test[np.isin(data.splits.test, missing)] = data.splits.test[cond[data.splits.test] == 0][0]
    with pytest.raises(ValueError, match="rain_75"):
        cb.on_fit_start(_federation(data))  # before training, not after the last round
    data, cond = _carla_like()
    with pytest.raises(ValueError, match="rain_75"):
        evaluate_weather(PixelModel(), data, indices=np.setdiff1d(data.splits.test, missing))
    with pytest.raises(ValueError, match="metadata"):
        evaluate_weather(PixelModel(), _data(_images(8)), mode="metadata")
    with pytest.raises(ValueError, match="mode"):
        evaluate_weather(PixelModel(), _data(_images(8)), mode="real")
    with pytest.raises(ValueError, match="intensity"):
        WeatherImages(_images(2), "clear", 50)


def _rows(privacy: bool = False) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for w, i in WEATHER_CONDITIONS:
        r = {"condition": w, "intensity": i, "n_images": 10, "map": float(rng.random()),
             "map_50": float(rng.random()), "fairness_score": float(rng.random()), "tpr/0": 0.5}
        if privacy:
            r["privacy_score"] = float(rng.random())
        rows.append(r)
    return rows


def test_weather_metrics_keys_and_adverse_mean():
    rows = _rows()
    out = weather_metrics(rows)
    assert out["weather/clear_0/map"] == rows[0]["map"]
    assert out["weather/fog_75/fairness_score"] == rows[11]["fairness_score"]
    assert out["weather/adverse_mean/map_50"] == pytest.approx(np.mean([r["map_50"] for r in rows[1:]]))
    assert not any("tpr" in k or "privacy" in k for k in out)
    assert len([k for k in out if k.endswith("/map")]) == 14  # 13 conditions + adverse mean
    with pytest.raises(ValueError, match="cloud_50"):
        weather_metrics(rows[:2] + rows[3:])
    with pytest.raises(ValueError, match="exactly one row"):
        weather_metrics(rows + rows[:1])


@pytest.mark.parametrize("privacy", [False, True])
def test_plot_has_one_panel_per_metric_and_three_lines_from_the_clear_value(tmp_path, privacy):
    rows = _rows(privacy)
    path = tmp_path / "weather.png"
    fig = plot_weather(rows, path, title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axes = fig.axes
    keys = ["map", "map_50", "fairness_score"] + (["privacy_score"] if privacy else [])
    assert len(axes) == len(keys)
    table = {(r["condition"], r["intensity"]): r for r in rows}
    for ax, key in zip(axes, keys):
        lines = ax.get_lines()
        assert [ln.get_label() for ln in lines] == ["cloud", "rain", "fog"]
        for ln in lines:
            np.testing.assert_array_equal(ln.get_xdata(), WEATHER_INTENSITIES)
            expected = [table[("clear", 0)][key]] + [table[(ln.get_label(), i)][key] for i in WEATHER_INTENSITIES[1:]]
            np.testing.assert_allclose(ln.get_ydata(), expected)


def test_json_has_13_conditions_and_nulls_for_nan(tmp_path):
    rows = _rows()
    rows[3]["fairness_score"] = float("nan")
    payload = json.loads(write_weather_json(tmp_path / "w.json", rows, round=4).read_text())
    assert payload["round"] == 4 and len(payload["conditions"]) == 13
    assert payload["conditions"][3]["fairness_score"] is None


class RecordingWandb(WandbLogger):
    def __init__(self):  # no wandb run: only the calls are recorded
        self.calls: list[tuple] = []

    def log_image(self, key, images, step=None, **kwargs):
        self.calls.append(("image", key, images, step))

    def log_table(self, key, columns=None, data=None, dataframe=None, step=None):
        self.calls.append(("table", key, columns, data, step))


def _federation(data, rank_zero=True, rounds=3):
    fabric = SimpleNamespace(is_global_zero=rank_zero, loggers=[RecordingWandb()])
    return SimpleNamespace(fabric=fabric, data=data, settings=SimpleNamespace(rounds=rounds))


def test_callback_adds_metrics_writes_files_and_logs_to_wandb(tmp_path):
    data = _data(_images(12))
    cb = WeatherEvaluation(tmp_path, every=None)
    assert [cb.due(r, 3) for r in range(3)] == [False, False, True]
    assert [WeatherEvaluation(tmp_path, every=2).due(r, 5) for r in range(5)] == [False, True, False, True, True]
    fed = _federation(data)
    metrics: dict = {}
    cb.on_round_end(fed, 1, PixelModel(), metrics)
    assert metrics == {} and not (tmp_path / "weather.json").exists()
    cb.on_round_end(fed, 2, PixelModel(), metrics)
    assert metrics["weather/rain_50/map"] == cb.rows[6]["map"] and "weather/eval_seconds" in metrics
    payload = json.loads((tmp_path / "weather.json").read_text())
    assert len(payload["conditions"]) == 13 and payload["mode"] == "synthetic" and payload["round"] == 2
    assert (tmp_path / "weather.png").is_file()
    (image, table) = fed.fabric.loggers[0].calls
    assert image == ("image", "weather/plot", [str(tmp_path / "weather.png")], 2)
    assert table[1] == "weather/table" and table[2][:3] == ["condition", "intensity", "n_images"]
    assert len(table[3]) == 13 and table[4] == 2
    other = _federation(data, rank_zero=False)
    metrics = {}
    WeatherEvaluation(tmp_path / "r1").on_round_end(other, 2, PixelModel(), metrics)
    assert metrics == {} and other.fabric.loggers[0].calls == []


def test_callback_config_checks(tmp_path):
    ev = {"weather": True, "weather_every": None, "weather_seed": 0, "weather_mode": "auto", "weather_privacy": True}
    cfg = OmegaConf.create({"dataset": {"task": "classification", "name": "adult"}, "eval": ev})
    with pytest.raises(ConfigError, match="adult"):
        WeatherEvaluation.from_config(cfg, tmp_path)
    cfg = OmegaConf.create({"dataset": {"task": "detection", "name": "synthetic"}, "eval": {**ev, "weather_every": 0}})
    with pytest.raises(ConfigError, match="eval.weather_every: "):
        WeatherEvaluation.from_config(cfg, tmp_path)
    cb = WeatherEvaluation.from_config(OmegaConf.create({"dataset": {"task": "detection", "name": "synthetic"},
                                                         "eval": {**ev, "weather_seed": 7, "weather_privacy": False}}),
                                       tmp_path, privacy=object())
    assert (cb.seed, cb.mode, cb.every, cb.privacy) == (7, "auto", None, None)
    with pytest.raises(ConfigError, match="eval.weather_mode: "):
        WeatherEvaluation.from_config(OmegaConf.create({"dataset": {"task": "detection", "name": "synthetic"},
                                                        "eval": {**ev, "weather_mode": "sunny"}}), tmp_path)


def test_finetune_lr_schedule_and_settings():
    s = FinetuneSettings()
    np.testing.assert_allclose([s.lr_factor(e) for e in range(10)], [1] * 6 + [0.1] * 2 + [0.01] * 2)
    with pytest.raises(ValueError, match="--epochs"):
        FinetuneSettings(epochs=0)
    with pytest.raises(ValueError, match="--weather-mode"):
        FinetuneSettings(weather_mode="x")


def test_load_run_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        read_trained_config(tmp_path)
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create({"seed": 99}), tmp_path / ".hydra" / "config.yaml")
    assert read_trained_config(tmp_path).seed == 99
    # RunFiles' resolved config.yaml wins over Hydra's unresolved one
    OmegaConf.save(OmegaConf.create({"dataset": {"name": "x", "num_images": 5}, "seed": 1}), tmp_path / "config.yaml")
    cfg = read_trained_config(tmp_path, overrides=["dataset.num_images=80"])
    assert cfg.seed == 1 and cfg.dataset.num_images == 80
    with pytest.raises(ValueError, match="dataset.num_imgs: the run's config"):
        read_trained_config(tmp_path, overrides=["dataset.num_imgs=80"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        read_trained_config(tmp_path, overrides=["dataset.num_images"])
    cfg = read_trained_config(tmp_path, dataset="synthetic")
    assert cfg.dataset == OmegaConf.load(REPO / "conf" / "dataset" / "synthetic.yaml")
    with pytest.raises(FileNotFoundError, match="available: .*synthetic"):
        read_trained_config(tmp_path, dataset="nope")


@pytest.fixture(scope="module")
def femto_client():
    from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
    from resfl_lightning.clients.detection import DetectionClient
    from resfl_lightning.models.yolo import YoloSpec

    torch.manual_seed(0)
    return DetectionClient(YoloSpec(scale="femto", image_size=64), 3, LossWeights(), UfmSettings(),
                           OptimSettings(momentum=0.0, weight_decay=0.0))


def test_parameter_groups_split_backbone_from_the_rest(femto_client):
    groups = parameter_groups(femto_client, lr=0.02, backbone_lr_scale=0.1)
    names = {id(p): n for n, p in femto_client.named_parameters()}
    backbone = {names[id(p)] for p in groups[0]["params"]}
    rest = {names[id(p)] for p in groups[1]["params"]}
    # yolov8.yaml: layers 0-9 are the backbone (Conv/C2f/SPPF), 10+ neck and Detect; adversary and NIG outside.
    expected = {n for n in names.values() if n.split(".")[:3] == ["model", "detector", "model"]
                and int(n.split(".")[3]) <= 9}
    assert backbone == expected and backbone.isdisjoint(rest) and backbone | rest == set(names.values())
    assert any(n.startswith("adversary.") for n in rest) and any(n.startswith("model.nig.") for n in rest)
    assert (groups[0]["lr"], groups[1]["lr"]) == pytest.approx((0.002, 0.02))


def test_finetune_step_clips_grad_norm_and_freezes_backbone_at_scale_zero(femto_client):
    import lightning as L

    from resfl_lightning.data.detection import detection_collate

    fabric = L.Fabric(accelerator="cpu", devices=1, precision="32-true")
    src = _images(4, h=64, w=64)
    batch = detection_collate([DetectionDataset(src)[i] for i in range(4)])
    before = {n: p.detach().clone() for n, p in femto_client.named_parameters()}
    backbone_ids = {id(p) for p in parameter_groups(femto_client, 1.0, 0.0)[0]["params"]}
    settings = FinetuneSettings(epochs=1, backbone_lr_scale=0.0, grad_clip=0.5)
    log = finetune(fabric, femto_client, lambda epoch: [batch], settings, lr=1.0)
    assert log[0]["steps"] == 1 and log[0]["grad_norm/mean"] > 0.5  # the raw norm, before clipping
    grads, step, head_grad = [], [], []
    for n, p in femto_client.named_parameters():
        if p.grad is not None:
            grads.append(p.grad.reshape(-1))  # left in place after the step: the clipped gradient
        if id(p) in backbone_ids:
            assert torch.equal(p, before[n]), n
        elif p.grad is not None:
            step.append((p.detach() - before[n]).reshape(-1))
            head_grad.append(p.grad.reshape(-1))
    # Clipped to norm 0.5 over every parameter; SGD without momentum / decay at lr 1 steps by minus that gradient.
    assert float(torch.cat(grads).norm()) == pytest.approx(0.5, rel=1e-4)
    torch.testing.assert_close(torch.cat(step), -torch.cat(head_grad), rtol=1e-5, atol=1e-6)  # float32 p - p_old


def test_finetune_under_fp16_amp_unscales_before_clipping(femto_client):
    import lightning as L
    from lightning.fabric.plugins.precision import MixedPrecision

    from resfl_lightning.data.detection import detection_collate

    # CPU fp16 autocast with a loss scaler: the same code path as fabric.precision=16-mixed on a GPU.
    fabric = L.Fabric(accelerator="cpu", devices=1, plugins=MixedPrecision("16-mixed", "cpu"))
    batch = detection_collate([DetectionDataset(_images(4, h=64, w=64))[i] for i in range(4)])
    before = torch.cat([p.detach().reshape(-1).clone() for p in femto_client.parameters()])
    log = finetune(fabric, femto_client, lambda epoch: [batch] * 8, FinetuneSettings(epochs=1, grad_clip=0.5),
                   lr=0.1)
    assert log[0]["steps"] == 8 and log[0]["steps"] > log[0]["skipped_steps"]  # overflowing steps are skipped
    grads = torch.cat([p.grad.reshape(-1) for p in femto_client.parameters() if p.grad is not None])
    # Clipped after unscaling: the true gradient has norm 0.5 (clipping the scaled one would leave 0.5 / scale).
    assert float(grads.norm()) == pytest.approx(0.5, rel=1e-3)
    assert not torch.equal(before, torch.cat([p.detach().reshape(-1) for p in femto_client.parameters()]))


def test_carla_builder_evaluates_real_frames_by_recorded_condition(tmp_path):
    from resfl_lightning.data.federated import build_federated_data
    from tests.fixtures_real import write_carla_fixture

    fx = write_carla_fixture(tmp_path / "carla", n_finetune=16, n_eval=26, n_attack=2)
    cfg = OmegaConf.load(REPO / "conf" / "dataset" / "carla.yaml")
    cfg.root, cfg.num_clients, cfg.image_size, cfg.batch_size = str(fx.root), 2, 96, 8
    data = build_federated_data(cfg, seed=0, printer=lambda *_: None)
    model = PixelModel()
    rows = evaluate_weather(model, data)  # auto -> the frames' recorded conditions, no synthetic corruption
    recorded = [WEATHER_CONDITIONS.index(c) for c in fx.conditions]
    for k, seen in enumerate(model.seen):
        expected = [i for i, (s, c) in enumerate(zip(fx.splits, recorded)) if s == "eval" and c == k]
        assert sorted(seen) == expected and rows[k]["n_images"] == 2
    # fine-tuning frames: the clients' train shards of the clear `finetune` split
    idx = finetune_indices(data)
    assert {fx.splits[i] for i in idx} == {"finetune"} and all(fx.conditions[i] == ("clear", 0) for i in idx)
