"""`dataset=facet` / `dataset=carla` in the federated trainer: records -> loaders, splits, preflight (fixtures only)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import resfl_lightning.data.real_detection as real
from resfl_lightning.config import ConfigError
from resfl_lightning.data.datasets.carla import CarlaDataset
from resfl_lightning.data.datasets.facet import FacetDataset
from resfl_lightning.data.detection import LoaderImages
from resfl_lightning.data.facet import FACET_CLASSES, FACET_DOWNLOAD_URL, FACET_LICENCE_NOTICE
from resfl_lightning.data.federated import FederatedDetectionData, build_federated_data, instantiate_dataset
from resfl_lightning.data.weather import WEATHER_CONDITIONS
from tests.fixtures_real import Fixture, person_rgb, write_carla_fixture, write_facet_fixture

CONF = Path(__file__).resolve().parents[3] / "conf" / "dataset"


def dataset_cfg(name: str, **overrides):
    """The shipped conf/dataset/<name>.yaml with overrides (what Hydra composes for dataset=<name>)."""
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    return cfg


@pytest.fixture(scope="module")
def facet(tmp_path_factory) -> Fixture:
    return write_facet_fixture(tmp_path_factory.mktemp("facet") / "facet")


@pytest.fixture(scope="module")
def carla(tmp_path_factory) -> Fixture:
    return write_carla_fixture(tmp_path_factory.mktemp("carla") / "carla")


@pytest.fixture(autouse=True)
def _fresh_notice(monkeypatch):
    monkeypatch.setattr(real, "_notice_shown", False)
    monkeypatch.delenv("FACET_ROOT", raising=False)
    monkeypatch.delenv("CARLA_ROOT", raising=False)


def dataset_preflight(cfg) -> None:
    """What the trainer does before any process starts: the dataset's keys checked, then its preflight."""
    instantiate_dataset(cfg).preflight()


def _build(cfg, seed: int = 0) -> FederatedDetectionData:
    data = build_federated_data(cfg, seed=seed, printer=lambda *_: None)
    assert isinstance(data, FederatedDetectionData) and isinstance(data.source, LoaderImages)
    return data


def _expected_group(mst: int) -> int:
    return mst - 1 if mst else -1


def _image_group_reference(fx: Fixture) -> np.ndarray:
    """Majority known group per image (ties: the first listed person), -1 without known persons; by hand."""
    out = []
    for i in range(len(fx.names)):
        groups = [_expected_group(p.mst) for p in fx.persons_of(i) if p.mst]
        counts = Counter(groups)
        out.append(max(groups, key=lambda g: (counts[g], -groups.index(g))) if groups else -1)
    return np.array(out)


def _check_splits(data: FederatedDetectionData, n_images: int, image_group: np.ndarray) -> None:
    s = data.splits
    parts = [s.test, s.reserve] + [a for c in s.clients for a in (c.train, c.val)]
    everything = np.concatenate(parts)
    assert len(everything) == len(np.unique(everything)) == n_images  # disjoint, and every image used once
    assert all(len(c.train) and len(c.val) for c in s.clients) and len(s.test)
    # IID stratification: every client holds floor or ceil of each group's share of the training pool
    for g in np.unique(image_group):
        per_client = [int((image_group[s.client_indices(i)] == g).sum()) for i in range(data.num_clients)]
        assert max(per_client) - min(per_client) <= 1, (g, per_client)


def test_each_yaml_names_its_dataset_class():
    assert type(instantiate_dataset(dataset_cfg("facet"))) is FacetDataset
    assert type(instantiate_dataset(dataset_cfg("carla"))) is CarlaDataset


# ---------------------------------------------------------------------------------------------------------- FACET


def test_facet_build_counts_groups_and_proxy(facet: Fixture):
    cfg = dataset_cfg("facet", root=str(facet.root), num_clients=2)
    data = _build(cfg)
    ann = data.source.annotations
    assert len(data.source) == 40 and len(ann) == len(facet.persons)
    assert data.num_classes == 1 and data.num_groups == 10 and data.task == "detection"
    assert data.image_size == 640 and data.batch_size == 16 and data.augment is True
    by_id = {p.person_id: p for p in facet.persons}
    people = [by_id[int(pid)] for pid in ann.extra["person_id"]]
    names = [p.name for p in data.source.records.image_paths]
    assert sorted(names) == sorted(facet.names)
    np.testing.assert_array_equal([names[i] for i in ann.image_index], [facet.names[p.image] for p in people])
    np.testing.assert_array_equal(ann.extra["mst"], [p.mst for p in people])
    np.testing.assert_array_equal(ann.groups, [_expected_group(p.mst) for p in people])
    np.testing.assert_array_equal(ann.proxy, [p.lighting for p in people])
    assert (ann.cls == 0).all()
    assert set(ann.groups) >= {-1} and len(set(ann.groups) - {-1}) >= 8  # mixed MST, some unknown
    assert max(Counter(ann.image_index.tolist()).values()) >= 3  # several persons per image
    # pixel boxes normalised by the image size
    for row, p in enumerate(people):
        width, height = facet.sizes[p.image]
        x, y, w, h = p.box
        np.testing.assert_allclose(ann.boxes[row], [(x + w / 2) / width, (y + h / 2) / height, w / width,
                                                    h / height], atol=1e-6)


def test_facet_splits_follow_spec(facet: Fixture):
    data = _build(dataset_cfg("facet", root=str(facet.root)))
    s = data.splits
    reference = _image_group_reference(facet)
    names = [p.name for p in data.source.records.image_paths]
    image_group = reference[[facet.names.index(n) for n in names]]
    assert data.num_clients == 4 and s.partition == "iid"
    assert len(s.test) == 8 and len(s.reserve) == 2  # 20 % test, 5 % reserve of 40 images
    for c in s.clients:  # stratified 90/10 train/val inside each shard
        assert len(c.val) == round(0.1 * (len(c.train) + len(c.val)))
    _check_splits(data, 40, image_group)
    again = _build(dataset_cfg("facet", root=str(facet.root)))
    np.testing.assert_array_equal(again.splits.test, s.test)  # the seed fixes the split
    other = _build(dataset_cfg("facet", root=str(facet.root)), seed=1)
    assert not np.array_equal(other.splits.test, s.test)


def test_facet_dirichlet_partition(facet: Fixture):
    data = _build(dataset_cfg("facet", root=str(facet.root), partition="dirichlet", dirichlet_alpha=0.1))
    assert data.splits.partition == "dirichlet" and data.splits.alpha == 0.1 and data.splits.h_tv > 0.1


def test_facet_class1_classes(facet: Fixture):
    data = _build(dataset_cfg("facet", root=str(facet.root), classes="class1", grouping="mst3"))
    ann = data.source.annotations
    assert data.num_classes == 52 and data.num_groups == 3
    by_id = {p.person_id: p for p in facet.persons}
    np.testing.assert_array_equal(ann.cls, [FACET_CLASSES.index(by_id[int(i)].class1) for i in ann.extra["person_id"]])


def _mask_box(img: np.ndarray, colour: np.ndarray, window: tuple[int, int, int, int], tol: int = 14):
    """Bounding box (x1, y1, x2, y2 px) of the pixels within `tol` of `colour` inside window."""
    x1, y1, x2, y2 = window
    patch = img[y1:y2, x1:x2].astype(int)
    mask = (np.abs(patch - colour.astype(int)) <= tol).all(-1)
    ys, xs = np.nonzero(mask)
    return x1 + xs.min(), y1 + ys.min(), x1 + xs.max() + 1, y1 + ys.max() + 1


def test_letterboxed_batches_keep_boxes_on_their_pixels(facet: Fixture):
    size = 128
    data = _build(dataset_cfg("facet", root=str(facet.root), image_size=size, batch_size=5, num_clients=2))
    batch = next(iter(data.train_loader(0, seed=0)))  # augmented (flip, colour): geometry only
    assert batch["img"].shape == (5, 3, size, size) and batch["img"].dtype == torch.float32
    assert batch["bboxes"].min() >= 0 and (batch["bboxes"][:, :2] + batch["bboxes"][:, 2:] / 2).max() <= 1 + 1e-5
    assert (batch["bboxes"][:, :2] - batch["bboxes"][:, 2:] / 2).min() >= -1e-5
    records = data.source.records
    by_id = {p.person_id: p for p in facet.persons}
    ann = data.source.annotations
    checked = 0
    for batch in data.test_loader():
        assert batch["img"].shape[1:] == (3, size, size) and len(batch["img"]) <= 5
        for b, image_id in enumerate(batch["image_id"].tolist()):
            img = (batch["img"][b].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
            h, w = records.image_sizes[image_id]
            scale = size / max(h, w)
            if h != w:  # letterbox padding (grey 114) on the short side
                assert (img[0, 0] == 114).all() and (img[-1, -1] == 114).all()
            rows = ann.rows_of(image_id)
            sel = (batch["batch_idx"] == b).numpy()
            boxes = batch["bboxes"].numpy()[sel]
            assert len(boxes) == rows.stop - rows.start
            for box, pid in zip(boxes, ann.extra["person_id"][rows], strict=True):
                p = by_id[int(pid)]
                cx, cy, bw, bh = box * size
                window = (max(0, int(cx - bw / 2) - 3), max(0, int(cy - bh / 2) - 3),
                          min(size, int(cx + bw / 2) + 4), min(size, int(cy + bh / 2) + 4))
                colour = person_rgb(p.mst).astype(int)
                # RGB order: the pixel at the box centre has the person's colour (not its BGR mirror)
                assert np.abs(img[int(cy), int(cx)].astype(int) - colour).max() <= 14
                found = _mask_box(img, colour, window)
                np.testing.assert_allclose(found, [cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], atol=1.5)
                np.testing.assert_allclose([bw, bh], np.array(p.box[2:]) * scale, atol=0.5)
                checked += 1
    assert checked == sum(len(facet.persons_of(facet.names.index(records.image_paths[i].name)))
                          for i in data.splits.test)


def test_facet_skip_mode_counts_and_raise_mode_names_the_row(tmp_path: Path, capsys):
    fx = write_facet_fixture(tmp_path / "facet", n_images=12, seed=3)
    csv_path = fx.root / "annotations" / "annotations.csv"
    lines = csv_path.read_text().splitlines()
    multi = next(i for i in range(12) if len(fx.persons_of(i)) >= 2)
    first = next(k for k, p in enumerate(fx.persons) if p.image == multi)
    # the first person of a multi-person image gets a box far outside the image (x 12 -> 912)
    assert '""x"": ' in lines[1 + first]
    lines[1 + first] = lines[1 + first].replace('""x"": ', '""x"": 9', 1)
    # and a person of another image points at a file that does not exist
    other = next(k for k, p in enumerate(fx.persons) if p.image != multi)
    lines.append(lines[1 + other].replace(fx.names[fx.persons[other].image], "sa_missing.jpg").replace(
        f"{fx.persons[other].person_id},", "999,", 1))
    csv_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"annotations.csv row {first + 2} \(image {fx.names[multi]}\)"):
        _build(dataset_cfg("facet", root=str(fx.root), num_clients=2))
    data = _build(dataset_cfg("facet", root=str(fx.root), num_clients=2, on_error="skip"))
    n_skipped = len(fx.persons_of(multi)) + 1
    assert len(data.source) == 11 and len(data.source.annotations) == len(fx.persons) - n_skipped + 1
    assert data.source.records.num_skipped == n_skipped
    out = capsys.readouterr().out
    assert f"skipped {n_skipped} annotation rows" in out and "sa_missing.jpg" in out


def test_facet_preflight_missing_data_explains_download(tmp_path: Path):
    cases = {
        "no root": (dataset_cfg("facet"), "No FACET root given"),
        "missing folder": (dataset_cfg("facet", root=str(tmp_path / "nowhere")), str(tmp_path / "nowhere")),
        "no csv": (dataset_cfg("facet", root=str(tmp_path)), str(tmp_path / "annotations" / "annotations.csv")),
    }
    for name, (cfg, text) in cases.items():
        with pytest.raises(ConfigError) as err:
            dataset_preflight(cfg)
        message = str(err.value)
        assert message.startswith("dataset.root:"), name
        assert text in message and FACET_DOWNLOAD_URL in message and "dataset.root=" in message, name
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "annotations.csv").write_text("person_id\n")
    with pytest.raises(ConfigError, match="dataset.root: none of the image folders imgs_1"):
        dataset_preflight(dataset_cfg("facet", root=str(tmp_path)))


def test_facet_root_from_env_and_bad_values(facet: Fixture, monkeypatch):
    monkeypatch.setenv("FACET_ROOT", str(facet.root))
    dataset_preflight(dataset_cfg("facet"))  # ${oc.env:FACET_ROOT,null}
    for key, value in (("classes", "all"), ("grouping", "mst5"), ("on_error", "ignore"), ("image_size", 100),
                       ("partition", "shards"), ("val_fraction", 1.0)):
        with pytest.raises(ConfigError, match=f"dataset.{key}"):
            dataset_preflight(dataset_cfg("facet", **{key: value}))


def test_facet_licence_notice_once(facet: Fixture, capsys):
    cfg = dataset_cfg("facet", root=str(facet.root), num_clients=2)
    dataset_preflight(cfg)
    _build(cfg)  # build after preflight in the same process does not repeat it
    assert capsys.readouterr().out.count(FACET_LICENCE_NOTICE) == 1
    real._notice_shown = False
    _build(cfg)  # build without preflight (e.g. an evaluation script) shows it itself
    assert capsys.readouterr().out.count(FACET_LICENCE_NOTICE) == 1


def test_loader_reports_a_file_that_disappeared(tmp_path: Path):
    fx = write_facet_fixture(tmp_path / "facet", n_images=8, seed=1)
    data = _build(dataset_cfg("facet", root=str(fx.root), num_clients=2))
    path = data.source.records.image_paths[3]
    path.write_bytes(b"not a jpeg")
    with pytest.raises(ValueError, match=f"image 3: cannot read {path}"):
        data.source.load_image(3)


# ---------------------------------------------------------------------------------------------------------- CARLA


def test_carla_splits_map_to_test_reserve_and_clients(carla: Fixture):
    data = _build(dataset_cfg("carla", root=str(carla.root), num_clients=2, image_size=96, batch_size=4))
    ann, records = data.source.annotations, data.source.records
    assert list(records.image_meta["frame"]) == carla.names  # metadata order
    assert len(data.source) == 57 and len(ann) == len(carla.persons)
    assert data.num_classes == 1 and data.num_groups == 10 and data.augment is False
    split = np.array(carla.splits)
    np.testing.assert_array_equal(data.splits.test, np.flatnonzero(split == "eval"))
    np.testing.assert_array_equal(data.splits.reserve, np.flatnonzero(split == "attack"))
    _check_splits(data, 57, _image_group_reference(carla))
    train_pool = np.concatenate([data.splits.client_indices(i) for i in range(2)])
    assert set(split[train_pool]) == {"finetune"} and len(train_pool) == 40
    np.testing.assert_array_equal(ann.extra["mst"], [p.mst for p in carla.persons])
    np.testing.assert_array_equal(ann.groups, [_expected_group(p.mst) for p in carla.persons])
    np.testing.assert_array_equal(ann.proxy, [WEATHER_CONDITIONS.index(carla.conditions[p.image])
                                              for p in carla.persons])
    # per-image weather kept on the source for the weather evaluation (also for frames without pedestrians)
    np.testing.assert_array_equal(records.image_meta["condition"], [WEATHER_CONDITIONS.index(c)
                                                                    for c in carla.conditions])
    batch = next(iter(data.test_loader()))
    assert batch["img"].shape == (4, 3, 96, 96)
    assert (batch["img"][:, :, 0, 0] == 114 / 255).all()  # 96x56 frames letterboxed: grey rows on top


def test_carla_without_predefined_test_split_carves_it(carla: Fixture):
    cfg = dataset_cfg("carla", root=str(carla.root), num_clients=2, test_splits=[], reserve_splits=[],
                      train_splits=["finetune", "attack"])
    data = _build(cfg)
    split = np.array(data.source.records.image_meta["split"])
    assert len(data.source) == 44 and "eval" not in split
    assert len(data.splits.test) == round(0.2 * 44) and len(data.splits.reserve) == round(0.05 * 44)
    _check_splits(data, 44, _image_group_reference(carla)[[carla.names.index(f) for f in
                                                            data.source.records.image_meta["frame"]]])


def test_carla_preflight_messages(tmp_path: Path, carla: Fixture):
    cases = {
        "no root": (dataset_cfg("carla"), "dataset.root: no CARLA root given"),
        "missing": (dataset_cfg("carla", root=str(tmp_path / "x")), f"CARLA root {tmp_path / 'x'} does not exist"),
        "no tables": (dataset_cfg("carla", root=str(tmp_path)), f"{tmp_path / 'metadata.csv'} is missing"),
        "unknown split": (dataset_cfg("carla", root=str(carla.root), test_splits=["test"]),
                          "dataset.test_splits: no frame of split 'test'"),
    }
    for name, (cfg, text) in cases.items():
        with pytest.raises(ConfigError) as err:
            dataset_preflight(cfg)
        assert text in str(err.value), name
        assert "<root>/metadata.csv" in str(err.value) and "eval -> test split" in str(err.value), name
    with pytest.raises(ConfigError, match="dataset.reserve_splits: split 'finetune' is already used"):
        dataset_preflight(dataset_cfg("carla", root=str(carla.root), reserve_splits=["finetune"]))
    with pytest.raises(ConfigError, match="dataset.train_splits"):
        dataset_preflight(dataset_cfg("carla", root=str(carla.root), train_splits=[]))
    with pytest.raises(ConfigError, match="dataset.towns"):
        dataset_preflight(dataset_cfg("carla", root=str(carla.root), towns=["Town02"]))
    dataset_preflight(dataset_cfg("carla", root=str(carla.root)))


def test_carla_skip_mode_drops_the_frame(tmp_path: Path, capsys):
    fx = write_carla_fixture(tmp_path / "carla", n_finetune=12, n_eval=3, n_attack=2)
    label = fx.root / "labels" / "finetune" / f"{fx.names[1]}.txt"
    label.write_text(label.read_text() + "0 1.7 0.5 0.1 0.1\n")
    with pytest.raises(ValueError, match=f"{fx.names[1]}.txt line"):
        _build(dataset_cfg("carla", root=str(fx.root), num_clients=2))
    data = _build(dataset_cfg("carla", root=str(fx.root), num_clients=2, on_error="skip"))
    assert len(data.source) == 16 and fx.names[1] not in list(data.source.records.image_meta["frame"])
    assert "skipped 1 problems (frames dropped)" in capsys.readouterr().out
