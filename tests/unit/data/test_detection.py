"""Annotation containers, DetectionDataset, the collate format of CONVENTIONS.md and ground_truth_for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from resfl_lightning.data.augment import DetectionAugment
from resfl_lightning.data.detection import (
    AnnotatedImages,
    Annotations,
    ArrayImages,
    DetectionDataset,
    LoaderImages,
    detection_collate,
    ground_truth_for,
    letterbox,
)


def _toy(n_images: int = 5, size: int = 32) -> ArrayImages:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n_images, size, size, 3), dtype=np.uint8)
    # image 0: 2 boxes, image 1: none, image 2: 1, image 3: 3, image 4: 1 (rows deliberately unsorted)
    image_index = np.array([3, 0, 2, 3, 0, 4, 3])
    boxes = np.array([[0.5, 0.5, 0.2, 0.2], [0.25, 0.25, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0], [0.1, 0.1, 0.2, 0.2],
                      [0.75, 0.5, 0.5, 0.4], [0.6, 0.6, 0.2, 0.2], [0.9, 0.9, 0.2, 0.2]])
    ann = Annotations(image_index, np.zeros(7), boxes, groups=[1, 0, 2, -1, 1, 0, 2], proxy=[0, 1, 1, 0, 1, 0, 0],
                      extra={"row": np.arange(7)})
    return ArrayImages(images, ann)


def test_annotations_sorted_by_image_and_rows_of():
    ann = _toy().annotations
    assert np.all(np.diff(ann.image_index) >= 0)
    np.testing.assert_array_equal(ann.extra["row"], [1, 4, 2, 0, 3, 6, 5])  # stable sort keeps per-image order
    assert ann.rows_of(1) == slice(2, 2) and ann.rows_of(3) == slice(3, 6)
    np.testing.assert_array_equal(ann.groups[ann.rows_of(0)], [0, 1])
    sub = ann.select(ann.groups >= 1)
    assert len(sub) == 4 and set(sub.extra["row"]) == {0, 2, 4, 6}


@pytest.mark.parametrize(
    ("boxes", "match"),
    [([[0.5, 0.5, 0.0, 0.1]], "row 0"), ([[0.95, 0.5, 0.2, 0.1]], "row 0"), ([[np.nan, 0.5, 0.1, 0.1]], "row 0")],
)
def test_bad_boxes_raise_naming_the_row(boxes, match):
    with pytest.raises(ValueError, match=match):
        Annotations([0], [0], boxes, [0], [0])


def test_mismatched_columns_and_out_of_range_images_raise():
    with pytest.raises(ValueError, match="groups"):
        Annotations([0, 0], [0, 0], [[0.5, 0.5, 0.1, 0.1]] * 2, [0], [0, 0])
    ann = Annotations([5], [0], [[0.5, 0.5, 0.1, 0.1]], [0], [0])
    with pytest.raises(ValueError, match="image index 5"):
        ArrayImages(np.zeros((3, 8, 8, 3), np.uint8), ann)


def test_collate_matches_the_batch_format():
    data = _toy()
    ds = DetectionDataset(data, indices=[3, 1, 0, 4])
    batch = next(iter(DataLoader(ds, batch_size=4, shuffle=False, collate_fn=detection_collate)))
    assert batch["img"].shape == (4, 3, 32, 32) and batch["img"].dtype == torch.float32
    assert batch["img"].min() >= 0.0 and batch["img"].max() <= 1.0
    torch.testing.assert_close(batch["img"][0], torch.from_numpy(data.images[3]).permute(2, 0, 1).float() / 255)
    np.testing.assert_array_equal(batch["batch_idx"].numpy(), [0, 0, 0, 2, 2, 3])
    assert batch["batch_idx"].dtype == torch.float32
    assert batch["cls"].shape == (6, 1) and batch["cls"].dtype == torch.float32
    assert batch["bboxes"].shape == (6, 4) and batch["bboxes"].dtype == torch.float32
    assert batch["groups"].dtype == torch.int64 and batch["image_id"].dtype == torch.int64
    np.testing.assert_array_equal(batch["image_id"].numpy(), [3, 1, 0, 4])
    ann = data.annotations
    expected_rows = np.r_[np.arange(3, 6), np.arange(0, 2), np.arange(6, 7)]
    np.testing.assert_allclose(batch["bboxes"].numpy(), ann.boxes[expected_rows])
    np.testing.assert_array_equal(batch["groups"].numpy(), ann.groups[expected_rows])
    np.testing.assert_array_equal(batch["proxy"].numpy(), ann.proxy[expected_rows])


def test_collate_of_images_without_boxes():
    batch = detection_collate([DetectionDataset(_toy(), indices=[1])[0]])
    assert batch["bboxes"].shape == (0, 4) and batch["cls"].shape == (0, 1) and batch["batch_idx"].shape == (0,)
    assert ground_truth_for(batch)[0]["boxes"].shape == (0, 4)


def test_collate_rejects_mixed_image_sizes():
    small = {"img": torch.zeros(3, 8, 8, dtype=torch.uint8), "cls": torch.zeros(0, 1), "bboxes": torch.zeros(0, 4),
             "groups": torch.zeros(0, dtype=torch.long), "proxy": torch.zeros(0, dtype=torch.long), "image_id": 0}
    big = dict(small, img=torch.zeros(3, 16, 16, dtype=torch.uint8), image_id=1)
    with pytest.raises(ValueError, match="image_size"):
        detection_collate([small, big])


def test_ground_truth_for_hand_computed():
    batch = {
        "img": torch.zeros(2, 3, 100, 200),
        "batch_idx": torch.tensor([1.0, 0.0, 1.0]),
        "cls": torch.tensor([[0.0], [0.0], [2.0]]),
        "bboxes": torch.tensor([[0.5, 0.5, 0.2, 0.4], [0.1, 0.2, 0.2, 0.4], [1.0, 1.0, 0.5, 0.5]]),
        "groups": torch.tensor([3, -1, 0]),
        "image_id": torch.tensor([10, 11]),
    }
    gt = ground_truth_for(batch)  # H=100, W=200 taken from the images
    torch.testing.assert_close(gt[0]["boxes"], torch.tensor([[0.0, 0.0, 40.0, 40.0]]))
    torch.testing.assert_close(gt[1]["boxes"], torch.tensor([[80.0, 30.0, 120.0, 70.0], [150.0, 75.0, 250.0, 125.0]]))
    assert gt[1]["labels"].tolist() == [0, 2] and gt[1]["labels"].dtype == torch.int64
    assert gt[0]["groups"].tolist() == [-1] and gt[1]["groups"].tolist() == [3, 0]
    square = ground_truth_for(batch, image_size=10)
    torch.testing.assert_close(square[1]["boxes"][0], torch.tensor([4.0, 3.0, 6.0, 7.0]))


def test_loader_images_and_bad_images():
    ann = Annotations([0, 1], [0, 0], [[0.5, 0.5, 0.5, 0.5]] * 2, [0, 1], [0, 0])
    src = LoaderImages(2, lambda i: np.full((16, 16, 3), 40 * i, np.uint8), ann)
    assert isinstance(src, AnnotatedImages)
    batch = detection_collate([DetectionDataset(src)[k] for k in range(2)])
    assert torch.allclose(batch["img"][1], torch.full((3, 16, 16), 40 / 255))
    broken = LoaderImages(2, lambda i: np.zeros((16, 16), np.float32), ann)
    with pytest.raises(ValueError, match="image 1"):
        DetectionDataset(broken)[1]
    with pytest.raises(ValueError, match="out of range"):
        DetectionDataset(src, indices=[0, 2])


def test_letterbox_moves_boxes_with_the_pixels():
    image = np.zeros((50, 100, 3), np.uint8)
    image[10:30, 40:60] = 255  # box: x 40..60, y 10..30 -> xywhn (0.5, 0.4, 0.2, 0.4)
    boxed, boxes = letterbox(image, np.array([[0.5, 0.4, 0.2, 0.4]], np.float32), 200)
    assert boxed.shape == (200, 200, 3)
    ys, xs = np.nonzero(boxed[..., 0] > 128)
    # scale 2, pad 50 rows on top: x 80..120, y 70..110
    np.testing.assert_allclose(boxes[0] * 200, [100.0, 90.0, 40.0, 40.0], atol=1e-4)
    assert (xs.min(), xs.max() + 1, ys.min(), ys.max() + 1) == (80, 120, 70, 110)
    assert boxed[0, 0, 0] == 114  # padding value


def test_augmentation_is_seeded_per_image_and_epoch():
    data = _toy(size=32)
    ds = DetectionDataset(data, augment=DetectionAugment(), seed=7)
    a = [ds[k]["img"] for k in range(5)]
    assert all(torch.equal(x, ds[k]["img"]) for k, x in enumerate(a))
    reordered = DetectionDataset(data, indices=[4, 3, 2, 1, 0], augment=DetectionAugment(), seed=7)
    assert torch.equal(reordered[0]["img"], a[4])  # independent of position in the subset
    ds.set_epoch(1)
    assert any(not torch.equal(x, ds[k]["img"]) for k, x in enumerate(a))
