"""Seeded detection augmentations (horizontal flip, brightness/contrast, hue) on uint8 RGB images + xywhn boxes."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import torch


def as_numpy_rng(rng: np.random.Generator | torch.Generator | int) -> np.random.Generator:
    """A numpy Generator from a numpy Generator (as is), a torch Generator (one draw seeds it) or an int seed."""
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, torch.Generator):
        return np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=rng)))
    if isinstance(rng, int | np.integer):
        return np.random.default_rng(int(rng))
    raise ValueError(f"expected a numpy/torch Generator or an int seed, got {type(rng).__name__}")


def hflip(image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror the image left-right; normalised centre x becomes 1 - x."""
    out = np.asarray(boxes, np.float32).copy()
    out[:, 0] = 1.0 - out[:, 0]
    return np.ascontiguousarray(image[:, ::-1]), out


def adjust_brightness_contrast(image: np.ndarray, brightness: float, contrast: float) -> np.ndarray:
    """x -> (b x - m) c + m with m the mean of b x (contrast about the image mean), as one 256-entry LUT."""
    mean = float(image.mean()) * brightness
    lut = np.clip((np.arange(256, dtype=np.float32) * brightness - mean) * contrast + mean + 0.5, 0, 255)
    return cv2.LUT(image, lut.astype(np.uint8))


def shift_hue(image: np.ndarray, fraction: float) -> np.ndarray:
    """Rotate the hue by `fraction` of the colour circle (OpenCV 8-bit hue has 180 steps)."""
    steps = round(fraction * 180)
    if steps % 180 == 0:
        return image
    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)
    hsv[..., 0] = ((hsv[..., 0].astype(np.int16) + steps) % 180).astype(np.uint8)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)


@dataclass(frozen=True)
class DetectionAugment:
    """Flip with probability flip_p; brightness and contrast factors U(1 +- b), U(1 +- c); hue shift U(+-hue) of the
    circle. Callable as (image uint8 HxWx3 RGB, boxes (m,4) xywhn, rng) -> (image, boxes); rng may be numpy/torch."""

    flip_p: float = 0.5
    brightness: float = 0.2
    contrast: float = 0.2
    hue: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 <= self.flip_p <= 1.0:
            raise ValueError(f"flip_p must be in [0, 1], got {self.flip_p}")
        for name in ("brightness", "contrast"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.hue <= 0.5:
            raise ValueError(f"hue must be in [0, 0.5], got {self.hue}")

    def __call__(self, image: np.ndarray, boxes: np.ndarray,
                 rng: np.random.Generator | torch.Generator | int) -> tuple[np.ndarray, np.ndarray]:
        g = as_numpy_rng(rng)
        # Draw every random number up front, in a fixed order, so the stream does not depend on which ops fire.
        flip, b, c, h = g.random() < self.flip_p, g.uniform(-1, 1), g.uniform(-1, 1), g.uniform(-1, 1)
        out = image
        if self.brightness or self.contrast:
            out = adjust_brightness_contrast(out, 1.0 + self.brightness * b, 1.0 + self.contrast * c)
        if self.hue:
            out = shift_hue(out, self.hue * h)
        boxes = np.asarray(boxes, np.float32)
        if flip:
            out, boxes = hflip(out, boxes)
        return out, boxes
