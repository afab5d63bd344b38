"""CARLA reader on a tiny export in the documented layout, written to tmp_path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from resfl_lightning.data.carla import load_carla
from resfl_lightning.data.weather import WEATHER_CONDITIONS

# frame -> (split, file suffix, width, height, town, weather, intensity, label lines)
FRAMES = {
    "f0001": ("finetune", ".png", 64, 48, "Town01", "clear", 0, ["0 0.5 0.5 0.25 0.5 1001", "0 0.2 0.3 0.1 0.2 1002"]),
    # 0.8 px past the right border (tolerance 0.02*80 + 1 px): clipped to x in [76, 80]
    "f0002": ("finetune", ".jpg", 80, 60, "Town03", "clear", 0, ["0 0.98 0.5 0.06 0.2"]),
    "f0003": ("finetune", ".png", 64, 48, "Town05", "clear", 0, []),  # no pedestrian
    "e0001": ("eval", ".png", 32, 32, "Town05", "fog", 50, ["", "0 0.5 0.5 0.5 0.5 7", ""]),  # blank lines ignored
    "e0002": ("eval", ".jpeg", 40, 20, "Town01", "rain", 100, ["0 0.25 0.25 0.5 0.5"]),
}
PEDESTRIANS = [("f0001", 0, 3), ("f0001", 1, 10), ("f0002", 0, 6), ("e0001", 0, 8)]  # e0002's MST unknown


def write_carla(root: Path) -> Path:
    rng = np.random.default_rng(0)
    meta = ["frame,split,town,weather,intensity"]
    for frame, (split, suffix, w, h, town, weather, intensity, lines) in FRAMES.items():
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "images" / split / (frame + suffix))
        (root / "labels" / split / f"{frame}.txt").write_text("".join(line + "\n" for line in lines))
        meta.append(f"{frame},{split},{town},{weather},{intensity}")
    (root / "metadata.csv").write_text("\n".join(meta) + "\n")
    peds = "".join(f"{f},{i},{m}\n" for f, i, m in PEDESTRIANS)
    (root / "pedestrians.csv").write_text("frame,ped_index,mst\n" + peds)
    return root


@pytest.fixture()
def carla_root(tmp_path: Path) -> Path:
    return write_carla(tmp_path / "carla")


def test_reads_frames_boxes_and_metadata(carla_root: Path):
    rec = load_carla(carla_root)
    assert list(rec.image_meta["frame"]) == list(FRAMES)
    assert [p.name for p in rec.image_paths] == ["f0001.png", "f0002.jpg", "f0003.png", "e0001.png", "e0002.jpeg"]
    np.testing.assert_array_equal(rec.image_sizes, [[48, 64], [60, 80], [48, 64], [32, 32], [20, 40]])
    np.testing.assert_array_equal(rec.image_index, [0, 0, 1, 3, 4])
    np.testing.assert_allclose(rec.boxes_xywhn, [[0.5, 0.5, 0.25, 0.5], [0.2, 0.3, 0.1, 0.2],
                                                 [78 / 80, 0.5, 4 / 80, 0.2], [0.5, 0.5, 0.5, 0.5],
                                                 [0.25, 0.25, 0.5, 0.5]], atol=1e-6)
    np.testing.assert_array_equal(rec.mst, [3, 10, 6, 8, 0])
    np.testing.assert_array_equal(rec.groups, [2, 9, 5, 7, -1])
    np.testing.assert_array_equal(rec.person_meta["ped_id"], [1001, 1002, -1, 7, -1])
    assert list(rec.image_meta["town"]) == ["Town01", "Town03", "Town05", "Town05", "Town01"]
    assert list(rec.image_meta["weather"]) == ["clear", "clear", "clear", "fog", "rain"]
    np.testing.assert_array_equal(rec.image_meta["intensity"], [0, 0, 0, 50, 100])
    conditions = [WEATHER_CONDITIONS[c] for c in rec.proxy]
    assert conditions == [("clear", 0)] * 3 + [("fog", 50), ("rain", 100)]
    assert rec.class_names == ["person"] and (rec.cls == 0).all() and rec.skipped == []


def test_split_filter_and_grouping(carla_root: Path):
    rec = load_carla(carla_root, split="eval", grouping="mst3")
    assert list(rec.image_meta["frame"]) == ["e0001", "e0002"]
    np.testing.assert_array_equal(rec.groups, [2, -1])
    assert load_carla(carla_root, split=["finetune"]).num_images == 3


def test_missing_root_and_tables(tmp_path: Path, carla_root: Path):
    with pytest.raises(FileNotFoundError, match="metadata.csv"):
        load_carla(tmp_path / "nowhere")
    (carla_root / "pedestrians.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"pedestrians\.csv is missing"):
        load_carla(carla_root)


def test_missing_column_names_file_and_header(carla_root: Path):
    (carla_root / "metadata.csv").write_text("frame,split,town,intensity\nf0001,finetune,Town01,0\n")
    for mode in ("raise", "skip"):
        with pytest.raises(ValueError, match=r"metadata\.csv row 1 \(header\).*'weather'"):
            load_carla(carla_root, on_error=mode)


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def _replace(path: Path, old: str, new: str) -> None:
    path.write_text(path.read_text().replace(old, new))


# name -> (mutation, error type, text expected in the message, frame that is dropped in skip mode)
BAD_CASES = {
    "short label line": (lambda r: _append(r / "labels/finetune/f0001.txt", "0 0.5 0.5 0.1\n"), ValueError,
                         "f0001.txt line 3", "f0001"),
    "label box outside": (lambda r: _append(r / "labels/finetune/f0001.txt", "0 1.5 0.5 0.2 0.2\n"), ValueError,
                          "f0001.txt line 3", "f0001"),
    "unknown class": (lambda r: _append(r / "labels/eval/e0002.txt", "1 0.5 0.5 0.1 0.1\n"), ValueError,
                      "e0002.txt line 2", "e0002"),
    "missing image": (lambda r: (r / "images/finetune/f0002.jpg").unlink(), FileNotFoundError,
                      "metadata.csv row 3 (frame f0002): no image", "f0002"),
    "corrupt image": (lambda r: (r / "images/eval/e0001.png").write_bytes(b"garbage" * 9), ValueError,
                      "metadata.csv row 5 (frame e0001): corrupt", "e0001"),
    "missing label": (lambda r: (r / "labels/finetune/f0003.txt").unlink(), FileNotFoundError,
                      "metadata.csv row 4 (frame f0003): label file", "f0003"),
    "unknown town": (lambda r: _replace(r / "metadata.csv", "e0002,eval,Town01", "e0002,eval,Town02"), ValueError,
                     "metadata.csv row 6 (frame e0002): unknown town 'Town02'", "e0002"),
    "clear with intensity": (lambda r: _replace(r / "metadata.csv", "Town03,clear,0", "Town03,clear,50"),
                             ValueError, "metadata.csv row 3 (frame f0002): (clear, 50)", "f0002"),
    "bad intensity": (lambda r: _replace(r / "metadata.csv", "fog,50", "fog,30"), ValueError,
                      "metadata.csv row 5 (frame e0001): intensity 30", "e0001"),
    "duplicate frame": (lambda r: _append(r / "metadata.csv", "f0003,eval,Town01,clear,0\n"), ValueError,
                        "metadata.csv row 7 (frame f0003): duplicate frame (first at row 4)", "f0003"),
    "bad mst": (lambda r: _append(r / "pedestrians.csv", "e0002,0,11\n"), ValueError,
                "pedestrians.csv row 6 (frame e0002): mst must be", "e0002"),
    "ped_index past boxes": (lambda r: _append(r / "pedestrians.csv", "f0001,2,4\n"), ValueError,
                             "pedestrians.csv row 6 (frame f0001): ped_index 2", "f0001"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_raises_naming_file_and_row(carla_root: Path, case: str):
    mutate, exc, text, _ = BAD_CASES[case]
    mutate(carla_root)
    with pytest.raises(exc) as err:
        load_carla(carla_root)
    assert text in str(err.value)


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_skip_mode_drops_the_frame(carla_root: Path, case: str):
    mutate, _, text, frame = BAD_CASES[case]
    mutate(carla_root)
    rec = load_carla(carla_root, on_error="skip")
    assert rec.num_skipped == 1 and text in rec.skipped[0]
    assert list(rec.image_meta["frame"]) == [f for f in FRAMES if f != frame]
    rec.validate()


def test_pedestrian_of_unknown_frame(carla_root: Path):
    _append(carla_root / "pedestrians.csv", "zzz,0,5\n")
    with pytest.raises(ValueError, match=r"pedestrians\.csv row 6 \(frame zzz\): frame is not listed"):
        load_carla(carla_root)
    assert load_carla(carla_root, on_error="skip").num_images == 5
