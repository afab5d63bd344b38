"""dataset=yolo on a tiny generated ultralytics folder (COCO8 images copied under new names): the reader's errors
name file / line / column, the loaded boxes equal the label files, and 1 process == 2 processes (gloo)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from resfl_lightning.data.yolo import load_yolo

REPO = Path(__file__).resolve().parents[2]


def make_yolo(shared_data: Path, root: Path, copies: int = 6) -> tuple[Path, Path]:
    """`copies` renamed copies of each COCO8 image + labels; a groups CSV by label row (class 0 = person)."""
    coco = shared_data / "coco8"
    if not (coco / "images" / "train").is_dir():
        pytest.skip(f"COCO8 not found under {coco}")
    rows = ["image,box,group,camera"]
    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for image in sorted((coco / "images" / split).glob("*.jpg")):
            label = coco / "labels" / split / f"{image.stem}.txt"
            for c in range(copies if split == "train" else 2):
                name = f"{image.stem}_{c}"
                shutil.copy(image, root / "images" / split / f"{name}.jpg")
                lines = label.read_text().splitlines() if label.is_file() else []
                (root / "labels" / split / f"{name}.txt").write_text("\n".join(lines) + "\n")
                for j, line in enumerate(lines):
                    if line.split()[0] == "0":
                        rows.append(f"{name}.jpg,{j},{'dark' if (j + c) % 2 else 'light'},cam{c % 2}")
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: {0: person}\n")
    (root / "groups.csv").write_text("\n".join(rows) + "\n")
    return root / "data.yaml", root / "groups.csv"


def test_boxes_and_groups_match_the_files(shared_data, tmp_path):
    data_yaml, groups = make_yolo(shared_data, tmp_path / "y", copies=2)
    found = load_yolo(data_yaml, groups)
    assert found.group_names == ["dark", "light"] and (found.groups >= 0).all()
    for i, path in enumerate(found.image_paths):  # the person rows of each label file, in order
        label = path.parent.parent.parent / "labels" / path.parent.name / f"{path.stem}.txt"
        rows = [list(map(float, r.split()[1:])) for r in label.read_text().splitlines() if r.split()[0] == "0"]
        np.testing.assert_allclose(found.boxes[found.image_index == i], np.array(rows, np.float32).reshape(-1, 4))
    # one group per image (no box column) gives every person of the image that group
    per_image = tmp_path / "per_image.csv"
    per_image.write_text("image,group\n" + "".join(f"{p.name},{'a' if k % 2 else 'b'}\n"
                                                   for k, p in enumerate(found.image_paths)))
    by_image = load_yolo(data_yaml, per_image)
    expect = np.where(by_image.image_index % 2 == 1, 0, 1)
    np.testing.assert_array_equal(by_image.groups, expect)


@pytest.mark.parametrize(("damage", "message"), [
    ("label_row", r"labels/train/000000000009_0\.txt line 2: expected 'class cx cy w h'"),
    ("box_outside", r"labels/train/000000000009_0\.txt line 1: box .* outside the image"),
    ("no_label", r"000000000009_0\.jpg: image without a label file"),
    ("unknown_image", r"groups\.csv line 2 column 'image': 'nope\.jpg' is not an image"),
    ("bad_box_row", r"groups\.csv line 2 column 'box': row 99"),
])
def test_bad_input_stops_with_file_line_and_column(shared_data, tmp_path, damage, message):
    data_yaml, groups = make_yolo(shared_data, tmp_path / "y", copies=1)
    label = tmp_path / "y" / "labels" / "train" / "000000000009_0.txt"
    lines = label.read_text().splitlines()
    if damage == "label_row":
        label.write_text("\n".join([lines[0], "0 0.5 0.5 oops"]) + "\n")
    elif damage == "box_outside":
        label.write_text("0 0.95 0.5 0.3 0.2\n")
    elif damage == "no_label":
        label.unlink()
    else:
        rows = groups.read_text().splitlines()
        bad = "nope.jpg,0,dark,cam0" if damage == "unknown_image" else rows[1].split(",")[0] + ",99,dark,cam0"
        groups.write_text("\n".join([rows[0], bad] + rows[2:]) + "\n")
    before = sorted(str(p) for p in (tmp_path / "y").rglob("*"))
    with pytest.raises(ValueError, match=message):
        load_yolo(data_yaml, groups)
    assert sorted(str(p) for p in (tmp_path / "y").rglob("*")) == before  # nothing written into the data folder


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=st.text(alphabet="0123456789 .-ex", max_size=30))
def test_fuzzed_label_rows_load_or_name_their_line(tmp_path_factory, line):
    root = tmp_path_factory.mktemp("fz")
    (root / "images" / "train").mkdir(parents=True)
    (root / "labels" / "train").mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (32, 24)).save(root / "images" / "train" / "a.jpg")
    (root / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n" + line + "\n")
    (root / "data.yaml").write_text("train: images/train\nval: images/train\n")
    (root / "g.csv").write_text("image,group\na.jpg,x\n")
    try:
        found = load_yolo(root / "data.yaml", root / "g.csv")
    except ValueError as err:
        assert "a.txt line 2" in str(err), str(err)
    else:
        assert np.isfinite(found.boxes).all() and (found.boxes[:, 2:] > 0).all()


TINY = ["logger=none", "progress=false", "model.scale=femto", "dataset=yolo", "dataset.image_size=64",
        "dataset.num_clients=2", "dataset.batch_size=4", "dataset.val_fraction=0.2", "dataset.reserve_fraction=0.0",
        "federation.rounds=2", "eval.every=1", "optim.lr=0.01", "dataset.augment=false"]


def train(run_dir: Path, data_yaml: Path, groups: Path, *extra: str) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "YOLO_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "resfl_lightning.train", *TINY, f"dataset.data={data_yaml}",
           f"dataset.groups_file={groups}", f"run_dir={run_dir}", *extra]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


@pytest.mark.slow
def test_yolo_one_and_two_processes_give_the_same_model(shared_data, tmp_path):
    data_yaml, groups = make_yolo(shared_data, tmp_path / "y")
    train(tmp_path / "one", data_yaml, groups)
    train(tmp_path / "two", data_yaml, groups, "fabric.devices=2")
    one = torch.load(tmp_path / "one" / "checkpoints" / "last.pt", weights_only=True)["theta"]
    two = torch.load(tmp_path / "two" / "checkpoints" / "last.pt", weights_only=True)["theta"]
    torch.testing.assert_close(one, two, rtol=1e-4, atol=1e-5)
    assert not torch.equal(one, torch.zeros_like(one))
