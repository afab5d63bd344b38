"""Built-in synthetic person-detection benchmark: procedural street scenes with MST-toned person figures.

Deterministic from (seed, image index), no downloads. Darker skin tones can be made rarer (`imbalance`) and more
often dim-lit / in front of dark backgrounds (`dark_dim_correlation`), so a plain detector shows a group TPR gap.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np

from resfl_lightning.data.detection import Annotations, ArrayImages
from resfl_lightning.data.mst import GROUPINGS, MST_RGB, group_of_mst

_CACHE_VERSION = 1  # bump whenever rendering changes, so stale caches are not reused
_SHIFT = 4  # cv2 sub-pixel bits: coordinates are multiplied by 16 for smooth anti-aliased shapes
_SUB = 1 << _SHIFT
_AA = cv2.LINE_AA

_SKY = (  # (top colour, horizon colour) RGB
    ((90, 150, 220), (185, 212, 240)),  # clear
    ((145, 150, 160), (200, 200, 206)),  # overcast
    ((70, 80, 135), (232, 155, 105)),  # dusk
    ((120, 170, 200), (225, 225, 215)),  # hazy
)
_BUILDING = (
    (128, 128, 128), (170, 160, 145), (150, 75, 60), (110, 85, 65), (70, 80, 95), (40, 40, 45), (205, 195, 175),
    (95, 105, 100), (30, 28, 32), (185, 120, 90),
)
_CLOTHING = (
    (25, 25, 30), (235, 235, 235), (40, 55, 110), (70, 100, 160), (160, 30, 35), (120, 120, 125), (190, 170, 120),
    (40, 100, 55), (95, 60, 40), (210, 150, 40), (120, 50, 130), (230, 120, 150),
)
_DARK_CLOTHING = ((25, 25, 30), (35, 35, 45), (40, 45, 70), (55, 40, 30), (30, 50, 35))  # near-black, navy, brown
_HAIR = ((22, 18, 16), (50, 35, 25), (95, 62, 35), (200, 170, 110), (150, 150, 150), (120, 55, 30))


@dataclass(frozen=True)
class SyntheticSceneConfig:
    """Knobs of the synthetic benchmark (fractions are of the image height unless stated)."""

    image_size: int = 128
    min_persons: int = 1
    max_persons: int = 4
    min_person_height: float = 0.15
    max_person_height: float = 0.6
    imbalance: float = 1.0
    """MST k drawn with p_k ~ exp(-imbalance * (k-1)/9): 0 = uniform; imbalance = ln(p_1/p_10)."""
    mst_probs: tuple[float, ...] | None = None
    """Explicit P(MST = 1..10), overrides `imbalance` when given."""
    grouping: str = "mst10"
    dim_probability: float = 0.3
    """P(dim scene) when dark_dim_correlation = 0."""
    dark_dim_correlation: float = 0.5
    """c in [0, 1]: P(dim) = (1-c) dim_probability + c * mean darkness of the scene's persons, darkness = (MST-1)/9;
    likewise P(dark background behind a person) = (1-c) dark_background_probability + c * darkness."""
    dark_background_probability: float = 0.15
    dim_correlation: float | None = None
    """c for P(dim) alone (None: dark_dim_correlation). 0 keeps scene lighting independent of tone, so lighting is no
    side channel of the attribute."""
    background_correlation: float | None = None
    """c for P(dark background) alone (None: dark_dim_correlation)."""
    bright_range: tuple[float, float] = (0.85, 1.15)
    dim_range: tuple[float, float] = (0.2, 0.4)
    noise_std: float = 3.0
    """Std of additive Gaussian pixel noise (0..255 scale), after lighting."""
    clutter_range: tuple[int, int] = (3, 8)
    skin_clutter_probability: float = 0.35
    """Share of clutter shapes drawn in skin-swatch colours (the rest: clothing-like or random colours)."""
    occluder_probability: float = 0.3
    """P(a foreground occluder — car, bush or post — drawn over the persons)."""
    short_sleeve_probability: float = 0.5
    """P(bare forearms): more visible skin makes the tone a property of the person's appearance."""
    shorts_probability: float = 0.25
    """P(bare lower legs)."""
    sleeveless_probability: float | None = None
    """P(bare upper arms as well: a sleeveless top), drawn only when set (None: never, the legacy draws)."""
    dark_clothing_probability: float | None = None
    """P(a person dresses in dark colours), independent of tone (None: every clothing colour equally likely). In dark
    clothes against a dark backdrop or in a dim scene a person is seen by the skin alone, so darker tones are harder
    to detect there without tone being correlated with anything around the person."""
    min_box_size: int = 4
    """Visible boxes narrower or shorter than this many pixels are dropped."""

    def __post_init__(self) -> None:
        if self.image_size < 16:
            raise ValueError(f"image_size must be >= 16, got {self.image_size}")
        if not 0 <= self.min_persons <= self.max_persons:
            raise ValueError(f"need 0 <= min_persons <= max_persons, got {self.min_persons}, {self.max_persons}")
        if not 0 < self.min_person_height <= self.max_person_height <= 1.5:
            raise ValueError(
                f"need 0 < min_person_height <= max_person_height <= 1.5, got "
                f"{self.min_person_height}, {self.max_person_height}"
            )
        if self.imbalance < 0:
            raise ValueError(f"imbalance must be >= 0, got {self.imbalance}")
        if self.mst_probs is not None:
            p = np.asarray(self.mst_probs, dtype=float)
            if p.shape != (10,) or np.any(p < 0) or p.sum() <= 0:
                raise ValueError(f"mst_probs must be 10 non-negative weights, got {self.mst_probs}")
        if self.grouping not in GROUPINGS:
            raise ValueError(f"grouping must be one of {GROUPINGS}, got {self.grouping!r}")
        for name in ("dim_probability", "dark_dim_correlation", "dark_background_probability",
                     "skin_clutter_probability", "occluder_probability", "short_sleeve_probability",
                     "shorts_probability", "dim_correlation", "background_correlation",
                     "dark_clothing_probability", "sleeveless_probability"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        for name in ("bright_range", "dim_range"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be (lo, hi) with 0 < lo <= hi, got {(lo, hi)}")
        if self.noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {self.noise_std}")
        if not 0 <= self.clutter_range[0] <= self.clutter_range[1]:
            raise ValueError(f"clutter_range must be (lo, hi) with 0 <= lo <= hi, got {self.clutter_range}")
        if self.min_box_size < 1:
            raise ValueError(f"min_box_size must be >= 1, got {self.min_box_size}")


def mst_probabilities(cfg: SyntheticSceneConfig) -> np.ndarray:
    """P(MST = 1..10) for each generated person."""
    if cfg.mst_probs is not None:
        p = np.asarray(cfg.mst_probs, dtype=np.float64)
    else:
        p = np.exp(-cfg.imbalance * np.arange(10) / 9.0)
    return p / p.sum()


class RenderedScene(NamedTuple):
    """One image and its kept persons (draw order; boxes are the visible union, normalised xywh)."""

    image: np.ndarray
    boxes: np.ndarray
    mst: np.ndarray
    dark_background: np.ndarray
    dim: bool
    lighting: float


@dataclass
class SceneSet(ArrayImages):
    """Generated scenes: images (N,H,W,3) uint8 RGB, annotations (extra columns "mst", "dark_background"),
    per-image dim flag and lighting factor, and the config/seed that produced them."""

    dim: np.ndarray
    lighting: np.ndarray
    config: SyntheticSceneConfig
    seed: int

    @property
    def mst(self) -> np.ndarray:
        """MST value 1..10 of each annotated person."""
        return self.annotations.extra["mst"]


class _Layer:
    """An RGBA sprite over an image rectangle; colour is premultiplied (shapes are drawn AA onto black)."""

    def __init__(self, x0: int, y0: int, x1: int, y1: int) -> None:
        self.x0, self.y0, self.x1, self.y1 = x0, y0, x1, y1
        self.color = np.zeros((y1 - y0, x1 - x0, 3), np.uint8)
        self.alpha = np.zeros((y1 - y0, x1 - x0), np.uint8)

    def _pt(self, x: float, y: float) -> tuple[int, int]:
        return round((x - self.x0) * _SUB), round((y - self.y0) * _SUB)

    def ellipse(self, cx: float, cy: float, rx: float, ry: float, color: tuple, angle: float = 0.0) -> None:
        axes = (max(1, round(rx * _SUB)), max(1, round(ry * _SUB)))
        for canvas, col in ((self.color, color), (self.alpha, 255)):
            cv2.ellipse(canvas, self._pt(cx, cy), axes, angle, 0, 360, col, -1, _AA, _SHIFT)

    def polygon(self, pts: list[tuple[float, float]], color: tuple) -> None:
        poly = np.array([self._pt(x, y) for x, y in pts], np.int32)
        for canvas, col in ((self.color, color), (self.alpha, 255)):
            cv2.fillPoly(canvas, [poly], col, _AA, _SHIFT)

    def line(self, p: tuple[float, float], q: tuple[float, float], width: float, color: tuple) -> None:
        # Thick segment with round caps, built from a quad and two discs so sub-pixel widths stay smooth.
        (px, py), (qx, qy) = p, q
        dx, dy = qx - px, qy - py
        norm = max(np.hypot(dx, dy), 1e-6)
        ox, oy = -dy / norm * width / 2, dx / norm * width / 2
        self.polygon([(px + ox, py + oy), (qx + ox, qy + oy), (qx - ox, qy - oy), (px - ox, py - oy)], color)
        self.ellipse(px, py, width / 2, width / 2, color)
        self.ellipse(qx, qy, width / 2, width / 2, color)

    def rect(self, x0: float, y0: float, x1: float, y1: float, color: tuple) -> None:
        self.polygon([(x0, y0), (x1, y0), (x1, y1), (x0, y1)], color)


class _Canvas:
    """Float image plus, for each person drawn so far, the map of how much of it is still visible."""

    def __init__(self, image: np.ndarray) -> None:
        self.image = image.astype(np.float32)
        self.visible: list[tuple[int, int, np.ndarray]] = []  # (x0, y0, coverage map) per person, draw order

    def composite(self, layer: _Layer, person: bool) -> None:
        a = layer.alpha.astype(np.float32) * (1.0 / 255.0)
        region = self.image[layer.y0 : layer.y1, layer.x0 : layer.x1]
        region *= 1.0 - a[..., None]
        region += layer.color
        for x0, y0, vis in self.visible:  # the new layer hides earlier persons where it is opaque
            ix0, iy0 = max(x0, layer.x0), max(y0, layer.y0)
            ix1, iy1 = min(x0 + vis.shape[1], layer.x1), min(y0 + vis.shape[0], layer.y1)
            if ix0 < ix1 and iy0 < iy1:
                vis[iy0 - y0 : iy1 - y0, ix0 - x0 : ix1 - x0] *= 1.0 - a[iy0 - layer.y0 : iy1 - layer.y0,
                                                                        ix0 - layer.x0 : ix1 - layer.x0]
        if person:
            self.visible.append((layer.x0, layer.y0, a.copy()))


def _jitter(rng: np.random.Generator, color: tuple | np.ndarray, amount: float) -> tuple[int, int, int]:
    c = np.asarray(color, float) * rng.uniform(1 - amount, 1 + amount) + rng.normal(0, amount * 40, 3)
    return tuple(int(v) for v in np.clip(c, 0, 255))


def _random_color(rng: np.random.Generator, skin_p: float) -> tuple[int, int, int]:
    """Clutter colour: skin swatch (so skin colour alone does not mean "person"), clothing-like, or random."""
    u = rng.random()
    if u < skin_p:
        return _jitter(rng, MST_RGB[rng.choice(10)], 0.06)
    if u < skin_p + (1 - skin_p) / 2:
        return _jitter(rng, _CLOTHING[rng.integers(len(_CLOTHING))], 0.1)
    return tuple(int(v) for v in rng.integers(0, 256, 3))


def _draw_background(rng: np.random.Generator, cfg: SyntheticSceneConfig) -> tuple[np.ndarray, float]:
    s = cfg.image_size
    horizon = s * rng.uniform(0.3, 0.55)
    sky_top, sky_low = (np.array(c, np.float32) for c in _SKY[rng.integers(len(_SKY))])
    shade = rng.uniform(0.85, 1.1)
    ground_far = np.full(3, rng.uniform(95, 150), np.float32) * np.array(rng.uniform(0.9, 1.1, 3), np.float32)
    ground_near = ground_far * rng.uniform(0.55, 0.85)
    y = np.arange(s, dtype=np.float32)[:, None]
    t_sky = np.clip(y / max(horizon, 1.0), 0, 1)
    t_ground = np.clip((y - horizon) / max(s - horizon, 1.0), 0, 1)
    sky = sky_top * (1 - t_sky) + sky_low * t_sky
    ground = ground_far * (1 - t_ground) + ground_near * t_ground
    column = np.where(y < horizon, sky * shade, ground)  # (s, 3)
    img = np.ascontiguousarray(np.broadcast_to(column[:, None, :], (s, s, 3))).clip(0, 255).astype(np.uint8)

    def pt(x: float, yy: float) -> tuple[int, int]:
        return round(x * _SUB), round(yy * _SUB)

    for _ in range(rng.integers(2, 7)):  # buildings standing on the street edge, with window grids
        w = s * rng.uniform(0.12, 0.4)
        x0 = rng.uniform(-0.1 * s, s)
        top = horizon - s * rng.uniform(0.08, 0.5)
        base = horizon + s * rng.uniform(0.0, 0.08)
        color = _jitter(rng, _BUILDING[rng.integers(len(_BUILDING))], 0.1)
        cv2.rectangle(img, pt(x0, top), pt(x0 + w, base), color, -1, _AA, _SHIFT)
        if rng.random() < 0.8:
            wcol = _jitter(rng, (220, 220, 190) if rng.random() < 0.5 else (35, 40, 50), 0.1)
            step = rng.uniform(0.06, 0.1) * s
            for wy in np.arange(top + step * 0.4, base - step, step):
                for wx in np.arange(x0 + step * 0.3, x0 + w - step * 0.5, step):
                    cv2.rectangle(img, pt(wx, wy), pt(wx + step * 0.5, wy + step * 0.55), wcol, -1, _AA, _SHIFT)
    for _ in range(rng.integers(0, 4)):  # lane markings
        x = rng.uniform(0, s)
        yy = rng.uniform(horizon + 0.1 * s, s)
        ln = s * rng.uniform(0.05, 0.15)
        cv2.line(img, pt(x, yy), pt(x + ln, yy + rng.uniform(-2, 2)), (230, 230, 210) if rng.random() < 0.6
                 else (220, 190, 60), max(1, round(s * 0.012)), _AA, _SHIFT)
    for _ in range(rng.integers(cfg.clutter_range[0], cfg.clutter_range[1] + 1)):
        color = _random_color(rng, cfg.skin_clutter_probability)
        kind = rng.integers(5)
        cx, cy = rng.uniform(0, s), rng.uniform(0.2 * s, s)
        r = s * rng.uniform(0.02, 0.1)
        if kind == 0:  # blob
            cv2.ellipse(img, pt(cx, cy), pt(r, r * rng.uniform(0.5, 1.5)), rng.uniform(0, 180), 0, 360, color, -1,
                        _AA, _SHIFT)
        elif kind == 1:  # box / sign
            cv2.rectangle(img, pt(cx - r, cy - r * rng.uniform(0.5, 2)), pt(cx + r, cy + r), color, -1, _AA, _SHIFT)
        elif kind == 2:  # irregular polygon
            ang = np.sort(rng.uniform(0, 2 * np.pi, rng.integers(3, 7)))
            rad = r * rng.uniform(0.5, 1.5, len(ang))
            poly = np.stack([cx + rad * np.cos(ang), cy + rad * np.sin(ang)], 1) * _SUB
            cv2.fillPoly(img, [np.round(poly).astype(np.int32)], color, _AA, _SHIFT)
        elif kind == 3:  # stick / cable
            cv2.line(img, pt(cx, cy), pt(cx + rng.uniform(-3, 3) * r, cy + rng.uniform(-3, 3) * r), color,
                     max(1, round(r * 0.3)), _AA, _SHIFT)
        else:  # pole with a round top: a head-like distractor (often skin-coloured)
            top = cy - s * rng.uniform(0.15, 0.4)
            pole = _jitter(rng, (70, 70, 75), 0.2)
            cv2.line(img, pt(cx, cy), pt(cx, top), pole, max(1, round(s * 0.015)), _AA, _SHIFT)
            ball = _jitter(rng, MST_RGB[rng.choice(10)], 0.06) if rng.random() < 0.6 else color
            cv2.ellipse(img, pt(cx, top), pt(r * 0.6, r * 0.75), 0, 0, 360, ball, -1, _AA, _SHIFT)
    return img, horizon


class _Person(NamedTuple):
    cx: float
    feet: float
    h: float
    mst: int
    dark_bg: bool
    params: dict


def _sample_person(rng: np.random.Generator, cfg: SyntheticSceneConfig, horizon: float, mst: int,
                   dark_bg_p: float) -> _Person:
    s = cfg.image_size
    h = s * rng.uniform(cfg.min_person_height, cfg.max_person_height)
    cx = rng.uniform(-0.1 * s, 1.1 * s)
    feet = min(horizon + h * rng.uniform(0.35, 1.3), s + 0.2 * h)  # farther persons stand nearer the horizon
    skin = np.asarray(MST_RGB[mst - 1], float) * rng.uniform(0.92, 1.04) * rng.uniform(0.97, 1.03, 3)
    sleeveless = cfg.sleeveless_probability is not None and bool(rng.random() < cfg.sleeveless_probability)
    palette = _CLOTHING
    if cfg.dark_clothing_probability is not None and rng.random() < cfg.dark_clothing_probability:
        palette = _DARK_CLOTHING
    params = {
        "skin": tuple(int(v) for v in np.clip(skin, 0, 255)),
        "top": _jitter(rng, palette[rng.integers(len(palette))], 0.12),
        "bottom": _jitter(rng, palette[rng.integers(len(palette))], 0.12),
        "hair": _jitter(rng, _HAIR[rng.integers(len(_HAIR))], 0.1),
        "shoes": _jitter(rng, (35, 30, 30), 0.3),
        "short_sleeves": bool(rng.random() < cfg.short_sleeve_probability),
        "shorts": bool(rng.random() < cfg.shorts_probability),
        "hat": bool(rng.random() < 0.15),
        "width": rng.uniform(0.85, 1.15),
        "arm": rng.uniform(np.radians(4), np.radians(40), 2),
        "elbow": rng.uniform(np.radians(-10), np.radians(35), 2),
        "leg": rng.uniform(np.radians(2), np.radians(22), 2) * (1 if rng.random() < 0.5 else -1),
        "knee": rng.uniform(np.radians(-5), np.radians(12), 2),
        "facing": 1 if rng.random() < 0.5 else -1,
        "bg_w": rng.uniform(0.55, 0.95),
        "bg_top": rng.uniform(1.05, 1.35),
        "bg_color": tuple(int(v) for v in np.clip(rng.uniform(12, 45) + rng.normal(0, 3, 3), 0, 255)),
        "sleeveless": sleeveless,
    }
    dark_bg = bool(rng.random() < dark_bg_p)
    return _Person(cx, feet, h, mst, dark_bg, params)


def _draw_person(canvas: _Canvas, p: _Person, size: int) -> None:
    h, cx, feet, q = p.h, p.cx, p.feet, p.params
    top = feet - h
    x0, x1 = max(0, int(np.floor(cx - 0.5 * h)) - 2), min(size, int(np.ceil(cx + 0.5 * h)) + 3)
    y0, y1 = max(0, int(np.floor(top)) - 3), min(size, int(np.ceil(feet + 0.06 * h)) + 3)
    if x0 >= x1 or y0 >= y1:
        canvas.visible.append((0, 0, np.zeros((0, 0), np.float32)))
        return
    lay = _Layer(x0, y0, x1, y1)
    wf = q["width"]
    skin, top_c, bottom_c = q["skin"], q["top"], q["bottom"]
    shoulder_y, hip_y = top + 0.2 * h, top + 0.54 * h
    sw, hw = 0.105 * h * wf, 0.085 * h * wf
    leg_w, arm_w = 0.075 * h * wf, 0.055 * h * wf
    # legs (behind the torso): hip -> knee -> foot
    for side, sgn in enumerate((-1, 1)):
        hx = cx + sgn * 0.045 * h * wf
        a = q["leg"][side] * (1 if side == 0 else -1)
        kx, ky = hx + np.sin(a) * 0.23 * h, hip_y + np.cos(a) * 0.23 * h
        b = a + q["knee"][side] * q["facing"]
        fx, fy = kx + np.sin(b) * 0.22 * h, min(ky + np.cos(b) * 0.22 * h, feet - 0.02 * h)
        lay.line((hx, hip_y), (kx, ky), leg_w, bottom_c)
        lay.line((kx, ky), (fx, fy), leg_w * 0.9, skin if q["shorts"] else bottom_c)
        lay.ellipse(fx + q["facing"] * 0.025 * h, fy + 0.01 * h, 0.05 * h, 0.025 * h, q["shoes"])
    # torso with rounded shoulders; neck
    lay.line((cx, top + 0.13 * h), (cx, shoulder_y + 0.02 * h), 0.05 * h * wf, skin)
    lay.polygon([(cx - sw, shoulder_y), (cx + sw, shoulder_y), (cx + hw, hip_y + 0.03 * h),
                 (cx - hw, hip_y + 0.03 * h)], top_c)
    lay.ellipse(cx - sw + 0.02 * h, shoulder_y + 0.02 * h, 0.035 * h, 0.03 * h, top_c)
    lay.ellipse(cx + sw - 0.02 * h, shoulder_y + 0.02 * h, 0.035 * h, 0.03 * h, top_c)
    lay.rect(cx - hw, hip_y - 0.01 * h, cx + hw, hip_y + 0.04 * h, bottom_c)
    # arms: shoulder -> elbow -> hand (sleeves on the upper arm; bare forearm with short sleeves)
    for side, sgn in enumerate((-1, 1)):
        sx, sy = cx + sgn * (sw - 0.01 * h), shoulder_y + 0.025 * h
        a = q["arm"][side]
        ex, ey = sx + sgn * np.sin(a) * 0.17 * h, sy + np.cos(a) * 0.17 * h
        b = a - q["elbow"][side]
        hx, hy = ex + sgn * np.sin(b) * 0.16 * h, ey + np.cos(b) * 0.16 * h
        lay.line((sx, sy), (ex, ey), arm_w, skin if q["sleeveless"] else top_c)
        lay.line((ex, ey), (hx, hy), arm_w * 0.85, skin if q["short_sleeves"] or q["sleeveless"] else top_c)
        lay.ellipse(hx, hy, 0.03 * h, 0.032 * h, skin)
    # head: face ellipse, hair cap, optional hat
    hy = top + 0.085 * h
    lay.ellipse(cx, hy, 0.062 * h, 0.08 * h, skin)
    lay.ellipse(cx - q["facing"] * 0.01 * h, hy - 0.04 * h, 0.064 * h, 0.045 * h, q["hair"])
    if q["hat"]:
        lay.rect(cx - 0.08 * h, hy - 0.06 * h, cx + 0.08 * h, hy - 0.035 * h, top_c)
        lay.rect(cx - 0.05 * h, hy - 0.095 * h, cx + 0.05 * h, hy - 0.05 * h, top_c)
    canvas.composite(lay, person=True)


def _draw_occluder(rng: np.random.Generator, canvas: _Canvas, size: int) -> None:
    s = size
    kind = rng.integers(3)
    if kind == 0:  # car
        w, hgt = s * rng.uniform(0.3, 0.6), s * rng.uniform(0.1, 0.2)
        x0, bottom = rng.uniform(-0.2 * s, s - 0.1 * s), s * rng.uniform(0.8, 1.05)
        lay = _Layer(max(0, int(x0) - 2), max(0, int(bottom - 1.6 * hgt) - 2), min(s, int(x0 + w) + 3), s)
        if lay.x0 >= lay.x1 or lay.y0 >= lay.y1:
            return
        body = _jitter(rng, _CLOTHING[rng.integers(len(_CLOTHING))], 0.15)
        lay.rect(x0, bottom - hgt, x0 + w, bottom - 0.15 * hgt, body)
        lay.polygon([(x0 + 0.2 * w, bottom - hgt), (x0 + 0.3 * w, bottom - 1.55 * hgt),
                     (x0 + 0.7 * w, bottom - 1.55 * hgt), (x0 + 0.8 * w, bottom - hgt)], body)
        lay.rect(x0 + 0.33 * w, bottom - 1.45 * hgt, x0 + 0.67 * w, bottom - 1.05 * hgt, (150, 175, 190))
        for wx in (x0 + 0.2 * w, x0 + 0.8 * w):
            lay.ellipse(wx, bottom - 0.15 * hgt, 0.22 * hgt, 0.22 * hgt, (25, 25, 25))
    elif kind == 1:  # bush
        cx, cy, r = rng.uniform(0, s), s * rng.uniform(0.75, 1.0), s * rng.uniform(0.08, 0.18)
        lay = _Layer(max(0, int(cx - 2 * r)), max(0, int(cy - 1.5 * r)), min(s, int(cx + 2 * r) + 2), s)
        if lay.x0 >= lay.x1 or lay.y0 >= lay.y1:
            return
        green = _jitter(rng, (50, 105, 45), 0.2)
        for _ in range(3):
            lay.ellipse(cx + rng.uniform(-r, r), cy + rng.uniform(-0.4 * r, 0.4 * r), r * rng.uniform(0.6, 1.0),
                        r * rng.uniform(0.5, 0.8), _jitter(rng, green, 0.1))
    else:  # post
        x, w = rng.uniform(0, s), s * rng.uniform(0.02, 0.05)
        top = s * rng.uniform(0.1, 0.5)
        lay = _Layer(max(0, int(x - w) - 1), max(0, int(top) - 1), min(s, int(x + w) + 2), s)
        if lay.x0 >= lay.x1 or lay.y0 >= lay.y1:
            return
        lay.rect(x - w / 2, top, x + w / 2, s + 1, _jitter(rng, (80, 80, 85), 0.3))
    canvas.composite(lay, person=False)


def _correlation(own: float | None, cfg: SyntheticSceneConfig) -> float:
    return cfg.dark_dim_correlation if own is None else own


def render_scene(cfg: SyntheticSceneConfig, seed: int, index: int, *, draw_persons: bool = True) -> RenderedScene:
    """Render image `index` of the set generated from `seed` (its own RNG, so independent of the set size).

    draw_persons=False renders the identical scene without the person layers (same random draws); the pixels that
    differ are exactly the visible person pixels, which tests use as an independent mask.
    """
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be >= 0, got seed={seed}, index={index}")
    rng = np.random.default_rng([int(seed), int(index)])
    s = cfg.image_size
    mst_p = mst_probabilities(cfg)
    base, horizon = _draw_background(rng, cfg)

    n = int(rng.integers(cfg.min_persons, cfg.max_persons + 1))
    msts = rng.choice(10, size=n, p=mst_p) + 1
    darkness = (msts - 1) / 9.0
    c = _correlation(cfg.background_correlation, cfg)
    persons = [_sample_person(rng, cfg, horizon, int(m), (1 - c) * cfg.dark_background_probability + c * d)
               for m, d in zip(msts, darkness, strict=True)]
    persons.sort(key=lambda p: p.feet)  # far (higher feet) first, so nearer persons occlude them
    for p in persons:  # doorway / shadow patch behind the person: low contrast for dark tones
        if p.dark_bg:
            half = p.params["bg_w"] * p.h / 2
            cv2.rectangle(base, (round((p.cx - half) * _SUB), round((p.feet - p.params["bg_top"] * p.h) * _SUB)),
                          (round((p.cx + half) * _SUB), round((p.feet + 0.03 * p.h) * _SUB)), p.params["bg_color"],
                          -1, _AA, _SHIFT)
    canvas = _Canvas(base)
    for p in persons:
        if draw_persons:
            _draw_person(canvas, p, s)
    if rng.random() < cfg.occluder_probability:
        _draw_occluder(rng, canvas, s)

    c = _correlation(cfg.dim_correlation, cfg)
    p_dim = (1 - c) * cfg.dim_probability + c * (float(darkness.mean()) if n else cfg.dim_probability)
    dim = bool(rng.random() < p_dim)
    light = float(rng.uniform(*(cfg.dim_range if dim else cfg.bright_range)))
    tint = np.array([0.85, 0.92, 1.08], np.float32) if dim else rng.uniform(0.95, 1.05, 3).astype(np.float32)
    grad = 1.0 + rng.uniform(-0.3, 0.3) * np.linspace(-0.5, 0.5, s, dtype=np.float32)  # uneven illumination
    noise = rng.standard_normal((s, s, 3), dtype=np.float32) * np.float32(cfg.noise_std)
    img = canvas.image * (light * grad)[:, None, None] * tint + noise + 0.5
    image = np.clip(img, 0, 255).astype(np.uint8)

    boxes, kept = [], []
    if draw_persons:
        for k, (x0, y0, vis) in enumerate(canvas.visible):
            rows, cols = np.flatnonzero((vis > 0).any(1)), np.flatnonzero((vis > 0).any(0))
            if len(rows) == 0:
                continue
            bx0, bx1, by0, by1 = x0 + cols[0], x0 + cols[-1] + 1, y0 + rows[0], y0 + rows[-1] + 1
            if bx1 - bx0 < cfg.min_box_size or by1 - by0 < cfg.min_box_size:
                continue
            boxes.append(((bx0 + bx1) / 2 / s, (by0 + by1) / 2 / s, (bx1 - bx0) / s, (by1 - by0) / s))
            kept.append(k)
    return RenderedScene(
        image=image,
        boxes=np.asarray(boxes, np.float32).reshape(-1, 4),
        mst=np.array([persons[k].mst for k in kept], np.int64),
        dark_background=np.array([persons[k].dark_bg for k in kept], bool),
        dim=dim,
        lighting=light,
    )


def _cache_path(cache_dir: str | Path, cfg: SyntheticSceneConfig, n_images: int, seed: int) -> Path:
    key = json.dumps({"v": _CACHE_VERSION, "cfg": asdict(cfg), "n": n_images, "seed": seed}, sort_keys=True)
    return Path(cache_dir) / f"synthetic-{hashlib.sha256(key.encode()).hexdigest()[:20]}.npz"


def generate_scenes(cfg: SyntheticSceneConfig, n_images: int, seed: int,
                    cache_dir: str | Path | None = None) -> SceneSet:
    """Generate n_images scenes from seed; with cache_dir, reuse / write an npz keyed by (config, seed, n)."""
    if n_images < 0:
        raise ValueError(f"n_images must be >= 0, got {n_images}")
    path = _cache_path(cache_dir, cfg, n_images, seed) if cache_dir is not None else None
    if path is not None and path.is_file():
        with np.load(path) as z:
            return _assemble(cfg, seed, z["images"], z["image_index"], z["boxes"], z["mst"], z["dark_background"],
                             z["dim"], z["lighting"])
    s = cfg.image_size
    images = np.empty((n_images, s, s, 3), np.uint8)
    image_index, boxes, mst, dark_bg = [], [], [], []
    dim, lighting = np.zeros(n_images, bool), np.zeros(n_images, np.float32)
    for i in range(n_images):
        scene = render_scene(cfg, seed, i)
        images[i] = scene.image
        image_index.append(np.full(len(scene.mst), i, np.int64))
        boxes.append(scene.boxes)
        mst.append(scene.mst)
        dark_bg.append(scene.dark_background)
        dim[i], lighting[i] = scene.dim, scene.lighting
    cat = lambda parts, dt, shape: np.concatenate(parts).astype(dt) if parts else np.zeros(shape, dt)  # noqa: E731
    arrays = {
        "images": images, "image_index": cat(image_index, np.int64, (0,)), "boxes": cat(boxes, np.float32, (0, 4)),
        "mst": cat(mst, np.int64, (0,)), "dark_background": cat(dark_bg, bool, (0,)), "dim": dim,
        "lighting": lighting,
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, path)  # atomic: concurrent readers never see a half-written cache
    return _assemble(cfg, seed, **arrays)


def _assemble(cfg: SyntheticSceneConfig, seed: int, images: np.ndarray, image_index: np.ndarray, boxes: np.ndarray,
              mst: np.ndarray, dark_background: np.ndarray, dim: np.ndarray, lighting: np.ndarray) -> SceneSet:
    dim = np.asarray(dim, bool)
    ann = Annotations(
        image_index=image_index,
        cls=np.zeros(len(image_index), np.int64),
        boxes=boxes,
        groups=group_of_mst(mst, cfg.grouping),
        proxy=dim[image_index].astype(np.int64),  # lighting proxy: 0 = well lit, 1 = dim
        extra={"mst": np.asarray(mst, np.int64), "dark_background": np.asarray(dark_background, bool)},
    )
    return SceneSet(images=np.asarray(images), annotations=ann, dim=dim, lighting=np.asarray(lighting, np.float32),
                    config=cfg, seed=int(seed))
