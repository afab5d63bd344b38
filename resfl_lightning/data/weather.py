"""Synthetic weather corruptions (cloud, rain, fog) for any uint8 HxWx3 image, at intensity 0-100 %.

Each effect is a per-pixel blend from the clean image towards a weather "target" whose weight grows with intensity,
so 0 % is the identity exactly and the change grows monotonically with intensity. Random structure (cloud shadows,
fog density, rain streaks) comes only from `seed`; rain draws the first n(intensity) streaks of one seeded list, so a
heavier rain contains the streaks of a lighter one. Used to corrupt images the way the CARLA weather sweep varies them.
"""

from __future__ import annotations

import math
from numbers import Real

import cv2
import numpy as np

WEATHER_TYPES = ("clear", "cloud", "rain", "fog")
WEATHER_INTENSITIES = (0, 25, 50, 75, 100)
# The 13 evaluation conditions of the paper: clear, then cloud/rain/fog x 25/50/75/100 %.
WEATHER_CONDITIONS: tuple[tuple[str, int], ...] = (("clear", 0),) + tuple(
    (w, i) for w in ("cloud", "rain", "fog") for i in WEATHER_INTENSITIES[1:]
)
CHANNEL_ORDERS = ("rgb", "bgr")

_FOG_RGB = np.array([222.0, 225.0, 230.0])  # grey-white haze
_RAIN_RGB = np.array([200.0, 205.0, 215.0])  # light, slightly blue streaks
_COOL_TINT_RGB = np.array([0.92, 0.97, 1.07])  # overcast light is bluer


def condition_index(weather: str, intensity: int) -> int:
    """Index of (weather, intensity) in WEATHER_CONDITIONS; ValueError naming the pair when it is not one of them."""
    try:
        return WEATHER_CONDITIONS.index((weather, int(intensity)))
    except (ValueError, TypeError):
        raise ValueError(f"({weather!r}, {intensity!r}) is not a weather condition; expected one of "
                         f"{list(WEATHER_CONDITIONS)}") from None


def apply_weather(
    image: np.ndarray, condition: str, intensity: float, seed: int = 0, *, channel_order: str = "rgb"
) -> np.ndarray:
    """Corrupt a uint8 (H, W, 3) image with `condition` ("clear", "cloud", "rain", "fog") at `intensity` in [0, 100].

    Returns a new uint8 array of the same shape; intensity 0 (and "clear", which only allows 0) returns a copy.
    channel_order ("rgb" or "bgr", as cv2 loads) only matters for the colours of tint, haze and streaks.
    """
    _check_image(image)
    if condition not in WEATHER_TYPES:
        raise ValueError(f"unknown weather condition {condition!r}; expected one of {WEATHER_TYPES}")
    if isinstance(intensity, bool) or not isinstance(intensity, Real) or not 0 <= float(intensity) <= 100:
        raise ValueError(f"weather intensity must be a number in [0, 100] (percent), got {intensity!r}")
    if channel_order not in CHANNEL_ORDERS:
        raise ValueError(f"channel_order must be one of {CHANNEL_ORDERS}, got {channel_order!r}")
    if condition == "clear" and intensity != 0:
        raise ValueError(f"'clear' has no intensity; got {intensity!r} (use 0)")
    strength = float(intensity) / 100.0
    if strength == 0.0:
        return image.copy()
    rgb_order = channel_order == "rgb"
    effect = {"cloud": _cloud, "rain": _rain, "fog": _fog}[condition]
    out = effect(image.astype(np.float32), strength, np.random.default_rng(seed), rgb_order)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _check_image(image: np.ndarray) -> None:
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        got = f"{image.dtype} {image.shape}" if isinstance(image, np.ndarray) else type(image).__name__
        raise ValueError(f"weather corruptions expect a uint8 (H, W, 3) image, got {got}")
    if image.shape[0] == 0 or image.shape[1] == 0:
        raise ValueError(f"weather corruptions expect a non-empty image, got shape {image.shape}")


def _colour(rgb: np.ndarray, rgb_order: bool) -> np.ndarray:
    return (rgb if rgb_order else rgb[::-1]).astype(np.float32)


def _smooth_noise(shape: tuple[int, int], cells: int, rng: np.random.Generator) -> np.ndarray:
    """Low-frequency noise in [0, 1]: a coarse random grid, blurred at low resolution, upsampled (cloud-like blobs)."""
    h, w = shape
    gh = max(2, round(cells * h / max(h, w)))
    gw = max(2, round(cells * w / max(h, w)))
    grid = rng.random((gh, gw)).astype(np.float32)
    scale = 64 / max(h, w)  # build the field at <= 64 px, then upsample: the same look, a fraction of the cost
    lh, lw = max(2, round(h * min(scale, 1.0))), max(2, round(w * min(scale, 1.0)))
    field = cv2.resize(grid, (lw, lh), interpolation=cv2.INTER_LINEAR)
    sigma = max(lh, lw) / cells / 2
    field = cv2.GaussianBlur(field, (0, 0), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_REFLECT)
    field = cv2.resize(field, (w, h), interpolation=cv2.INTER_LINEAR)
    lo, hi = float(field.min()), float(field.max())
    return (field - lo) / (hi - lo) if hi > lo else np.zeros_like(field)


def _fog(img: np.ndarray, s: float, rng: np.random.Generator, rgb_order: bool) -> np.ndarray:
    """Haze: transmission t = exp(-beta s d n), d = depth proxy (far at the top), n = seeded density variation."""
    h, w, _ = img.shape
    depth = (1.0 - 0.7 * np.linspace(0.0, 1.0, h, dtype=np.float32))[:, None]  # 1 at the horizon/top, 0.3 at bottom
    density = 0.8 + 0.4 * _smooth_noise((h, w), 6, rng)
    transmission = np.exp(-2.0 * s * depth * density)[..., None]
    return img * transmission + _colour(_FOG_RGB, rgb_order) * (1.0 - transmission)


def _cloud(img: np.ndarray, s: float, rng: np.random.Generator, rgb_order: bool) -> np.ndarray:
    """Overcast: lower contrast, brightness and saturation, cool tint, soft cloud shadows; blended by s."""
    grey = img.mean(axis=2, keepdims=True)
    flat = 0.7 * img + 0.3 * grey  # desaturate
    target = flat.mean() + (flat - flat.mean()) * 0.6  # lower contrast
    target = target * 0.75 * _colour(_COOL_TINT_RGB, rgb_order)
    shadow = _smooth_noise(img.shape[:2], 5, rng)
    shadow = np.clip((shadow - 0.35) / 0.4, 0.0, 1.0)  # soft-edged blobs over part of the image
    target = target * (1.0 - 0.35 * shadow)[..., None]
    return img + s * (target - img)


def _rain(img: np.ndarray, s: float, rng: np.random.Generator, rgb_order: bool) -> np.ndarray:
    """Rain: darker, slightly blurred scene (blended by s) plus the first n(s) of a seeded list of streaks."""
    h, w, _ = img.shape
    wet = cv2.GaussianBlur(img, (0, 0), sigmaX=1.2, sigmaY=1.2, borderType=cv2.BORDER_REFLECT) * 0.72
    base = img + s * (wet - img)
    max_streaks = max(1, math.ceil(h * w / 350))
    angle = rng.uniform(-0.35, 0.35)  # common slant (radians from vertical), wind
    x0 = rng.uniform(0, w, max_streaks)
    y0 = rng.uniform(-0.1 * h, h, max_streaks)
    length = rng.uniform(0.02, 0.07, max_streaks) * h
    jitter = rng.normal(0.0, 0.04, max_streaks)
    alpha = rng.uniform(0.25, 0.6, max_streaks)
    n = round(s * max_streaks)
    mask = np.zeros((h, w), dtype=np.float32)
    thickness = max(1, round(min(h, w) / 700))
    for i in range(n):
        dx, dy = math.sin(angle + jitter[i]) * length[i], math.cos(angle + jitter[i]) * length[i]
        p1 = (round(x0[i]), round(y0[i]))
        p2 = (round(x0[i] + dx), round(y0[i] + dy))
        cv2.line(mask, p1, p2, float(alpha[i]), thickness=thickness, lineType=cv2.LINE_AA)
    mask = cv2.GaussianBlur(mask, (3, 3), 0)[..., None]
    return base * (1.0 - mask) + _colour(_RAIN_RGB, rgb_order) * mask
