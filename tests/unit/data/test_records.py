"""DetectionRecords container: validation, subsetting, box helpers, image header reading."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from resfl_lightning.data.records import (
    BadInput,
    DetectionRecords,
    clip_box_xyxy,
    mst_to_group,
    read_image_size,
)


def make_records() -> DetectionRecords:
    """3 images (100x200, 50x50, 80x40 as h x w) with 4 persons; image 1 has none."""
    return DetectionRecords(
        image_paths=[Path("a.jpg"), Path("b.jpg"), Path("c.jpg")],
        image_sizes=np.array([[100, 200], [50, 50], [80, 40]], dtype=np.int64),
        image_index=np.array([0, 2, 0, 2], dtype=np.int64),
        cls=np.zeros(4, dtype=np.int64),
        boxes_xywhn=np.array([[0.5, 0.5, 0.2, 0.4], [0.25, 0.25, 0.5, 0.5], [0.1, 0.1, 0.2, 0.2],
                              [0.5, 0.5, 1.0, 1.0]], dtype=np.float32),
        mst=np.array([1, 10, 0, 5], dtype=np.int64),
        groups=np.array([0, 9, -1, 4], dtype=np.int64),
        proxy=np.array([0, -1, 2, 1], dtype=np.int64),
        class_names=["person"],
        image_meta={"town": np.array(["T1", "T3", "T5"], dtype=object)},
        person_meta={"person_id": np.array([10, 11, 12, 13], dtype=np.int64)},
    )


def test_mst_to_group_both_groupings():
    mst = np.arange(11)
    np.testing.assert_array_equal(mst_to_group(mst, "mst10"), [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    np.testing.assert_array_equal(mst_to_group(mst, "mst3"), [-1, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    with pytest.raises(ValueError, match="11"):
        mst_to_group([11])
    with pytest.raises(ValueError, match="'mst5'"):
        mst_to_group([1], "mst5")


def test_valid_records_pass_and_counts():
    rec = make_records().validate()
    assert (rec.num_images, rec.num_persons, rec.num_skipped) == (3, 4, 0)
    np.testing.assert_array_equal(rec.persons_of(2), [1, 3])


@pytest.mark.parametrize("change, text", [
    ({"image_index": np.array([0, 3, 0, 2])}, "image_index"),
    ({"cls": np.array([0, 1, 0, 0])}, "cls"),
    ({"mst": np.array([1, 11, 0, 5])}, "mst"),
    ({"groups": np.array([0, 9, 3, 4])}, "unknown MST"),
    ({"proxy": np.array([0, -2, 2, 1])}, "proxy"),
    ({"groups": np.array([0, 9, -1])}, "groups must be int64"),
    ({"mst": np.array([1.0, 10, 0, 5])}, "mst must be int64"),
    ({"boxes_xywhn": np.array([[0.95, 0.5, 0.2, 0.4]] * 4, dtype=np.float32)}, "outside"),
    ({"boxes_xywhn": np.array([[0.5, 0.5, 0.0, 0.4]] * 4, dtype=np.float32)}, "empty"),
    ({"boxes_xywhn": np.array([[0.5, np.nan, 0.1, 0.4]] * 4, dtype=np.float32)}, "non-finite"),
    ({"image_sizes": np.array([[100, 200], [50, 0], [80, 40]])}, "b.jpg"),
    ({"image_meta": {"town": np.array(["T1"])}}, "image_meta"),
    ({"person_meta": {"pid": np.array([1, 2])}}, "person_meta"),
])
def test_validate_names_the_bad_field(change: dict, text: str):
    rec = dataclasses.replace(make_records(), **change)
    with pytest.raises(ValueError, match=text):
        rec.validate()


def test_subset_reorders_and_reindexes():
    rec = make_records()
    sub = rec.subset([2, 0]).validate()
    assert [p.name for p in sub.image_paths] == ["c.jpg", "a.jpg"]
    np.testing.assert_array_equal(sub.image_sizes, [[80, 40], [100, 200]])
    np.testing.assert_array_equal(sub.image_index, [0, 0, 1, 1])
    np.testing.assert_array_equal(sub.person_meta["person_id"], [11, 13, 10, 12])
    np.testing.assert_array_equal(sub.mst, [10, 5, 1, 0])
    assert list(sub.image_meta["town"]) == ["T5", "T1"]
    empty = rec.subset([1]).validate()
    assert (empty.num_images, empty.num_persons) == (1, 0)
    with pytest.raises(ValueError, match="duplicates"):
        rec.subset([0, 0])
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        rec.subset([3])


def test_boxes_xyxy_pixels():
    xyxy = make_records().boxes_xyxy()
    np.testing.assert_allclose(xyxy, [[80, 30, 120, 70], [0, 0, 20, 40], [0, 0, 40, 20], [0, 0, 40, 80]])


def test_clip_box():
    assert clip_box_xyxy(-3, 10, 50, 60, 100, 80, 0.02) == (0, 10, 50, 60)  # 3 px <= 0.02*100 + 1
    assert "outside" in clip_box_xyxy(-4, 10, 50, 60, 100, 80, 0.02)
    assert "outside" in clip_box_xyxy(10, 10, 50, 90, 100, 80, 0.02)
    assert "empty" in clip_box_xyxy(100, 10, 102, 60, 100, 80, 0.02)  # only the 2 px overhang: nothing inside


def test_read_image_size_matches_cv2_including_exif_rotation(tmp_path: Path):
    pixels = np.random.default_rng(0).integers(0, 256, (30, 70, 3), dtype=np.uint8)
    plain, rotated = tmp_path / "plain.jpg", tmp_path / "rotated.jpg"
    Image.fromarray(pixels).save(plain)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees when displayed
    Image.fromarray(pixels).save(rotated, exif=exif)
    for path in (plain, rotated):
        assert read_image_size(path) == cv2.imread(str(path)).shape[:2]  # cv2 honours EXIF orientation
    assert read_image_size(rotated) == (70, 30)
    (tmp_path / "bad.jpg").write_bytes(b"\x00" * 50)
    with pytest.raises(ValueError, match="bad.jpg"):
        read_image_size(tmp_path / "bad.jpg")
    with pytest.raises(FileNotFoundError):
        read_image_size(tmp_path / "none.jpg")


def test_bad_input_policy():
    with pytest.raises(ValueError, match="'ignore'"):
        BadInput("ignore")
    with pytest.raises(FileNotFoundError, match="gone"):
        BadInput("raise").report("gone", missing_file=True)
    skip = BadInput("skip")
    skip.report("first")
    skip.report("second", missing_file=True)
    assert skip.messages == ["first", "second"]
