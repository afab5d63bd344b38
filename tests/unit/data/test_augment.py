"""Seeded detection augmentations: flip geometry, colour jitter bounds, reproducibility."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from resfl_lightning.data.augment import DetectionAugment, adjust_brightness_contrast, hflip, shift_hue


def _scene() -> tuple[np.ndarray, np.ndarray]:
    image = np.full((40, 80, 3), 30, np.uint8)
    image[8:24, 10:30] = (200, 60, 40)  # x 10..30, y 8..24 -> xywhn (0.25, 0.4, 0.25, 0.4)
    return image, np.array([[0.25, 0.4, 0.25, 0.4]], np.float32)


def test_flip_maps_boxes_hand_computed():
    image, boxes = _scene()
    flipped, fboxes = hflip(image, boxes)
    np.testing.assert_allclose(fboxes, [[0.75, 0.4, 0.25, 0.4]])  # x 50..70 in an 80-px-wide image
    ys, xs = np.nonzero(flipped[..., 0] == 200)
    assert (xs.min(), xs.max() + 1, ys.min(), ys.max() + 1) == (50, 70, 8, 24)
    np.testing.assert_array_equal(flipped, image[:, ::-1])
    np.testing.assert_array_equal(boxes, _scene()[1])  # input untouched


def test_always_flip_and_never_flip():
    image, boxes = _scene()
    only_flip = DetectionAugment(flip_p=1.0, brightness=0.0, contrast=0.0, hue=0.0)
    out, ob = only_flip(image, boxes, np.random.default_rng(0))
    np.testing.assert_array_equal(out, image[:, ::-1])
    np.testing.assert_allclose(ob[:, 0], 1 - boxes[:, 0])
    identity = DetectionAugment(flip_p=0.0, brightness=0.0, contrast=0.0, hue=0.0)
    out, ob = identity(image, boxes, np.random.default_rng(0))
    np.testing.assert_array_equal(out, image)
    np.testing.assert_array_equal(ob, boxes)


def test_flip_rate_is_half():
    aug = DetectionAugment(brightness=0.0, contrast=0.0, hue=0.0)
    image, boxes = _scene()
    flips = [aug(image, boxes, np.random.default_rng(s))[1][0, 0] > 0.5 for s in range(400)]
    assert 0.4 < np.mean(flips) < 0.6


def test_brightness_and_contrast_hand_computed():
    grey = np.full((4, 4, 3), 100, np.uint8)
    assert np.all(adjust_brightness_contrast(grey, 1.2, 1.0) == 120)
    assert np.all(adjust_brightness_contrast(grey, 0.8, 1.5) == 80)  # contrast about the mean leaves a flat image
    two = np.full((2, 2, 3), 50, np.uint8)
    two[1] = 150  # mean 100
    out = adjust_brightness_contrast(two, 1.0, 1.2)
    assert np.all(out[0] == 40) and np.all(out[1] == 160)


def test_hue_shift_hand_computed():
    red = np.zeros((2, 2, 3), np.uint8)
    red[..., 0] = 255
    np.testing.assert_array_equal(shift_hue(red, 1 / 3)[0, 0], [0, 255, 0])
    np.testing.assert_array_equal(shift_hue(red, -1 / 3)[0, 0], [0, 0, 255])


def test_jitter_stays_within_configured_ranges():
    rng = np.random.default_rng(1)
    image = rng.integers(60, 200, (16, 16, 3), dtype=np.uint8)
    image[..., 0] = 220  # saturated enough for a stable hue
    hue_only = DetectionAugment(flip_p=0.0, brightness=0.0, contrast=0.0, hue=0.1)
    bright_only = DetectionAugment(flip_p=0.0, brightness=0.2, contrast=0.0, hue=0.0)
    h0 = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)[..., 0].astype(int)
    shifts, ratios = [], []
    for s in range(200):
        out, _ = hue_only(image, np.zeros((0, 4), np.float32), np.random.default_rng(s))
        d = (cv2.cvtColor(out, cv2.COLOR_RGB2HSV)[..., 0].astype(int) - h0 + 90) % 180 - 90
        shifts.append(np.median(d))
        out, _ = bright_only(image, np.zeros((0, 4), np.float32), np.random.default_rng(s))
        ratios.append(out.astype(float).mean() / image.mean())
    assert max(abs(x) for x in shifts) <= 18 + 1  # 10 % of OpenCV's 180-step hue circle (+1 rounding)
    assert max(abs(x) for x in shifts) > 12  # and the range is actually used
    assert 0.79 < min(ratios) < 0.85 and 1.15 < max(ratios) < 1.21


def test_reproducible_from_numpy_and_torch_generators():
    image, boxes = _scene()
    aug = DetectionAugment()
    a = aug(image, boxes, np.random.default_rng(5))
    b = aug(image, boxes, np.random.default_rng(5))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    t1 = aug(image, boxes, torch.Generator().manual_seed(3))
    t2 = aug(image, boxes, torch.Generator().manual_seed(3))
    np.testing.assert_array_equal(t1[0], t2[0])
    outs = {aug(image, boxes, np.random.default_rng(s))[0].tobytes() for s in range(10)}
    assert len(outs) > 5


@pytest.mark.parametrize("kwargs", [{"flip_p": 1.5}, {"brightness": -0.1}, {"contrast": 1.0}, {"hue": 0.7}])
def test_bad_parameters_raise(kwargs):
    with pytest.raises(ValueError):
        DetectionAugment(**kwargs)
