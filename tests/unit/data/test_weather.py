"""Weather corruptions: identity at 0 %, monotone in intensity, seeded, shape/dtype preserving, strict inputs."""

from __future__ import annotations

import numpy as np
import pytest

from resfl_lightning.data.weather import (
    WEATHER_CONDITIONS,
    apply_weather,
    condition_index,
)

EFFECTS = ("cloud", "rain", "fog")
LEVELS = (0, 25, 50, 75, 100)


def scene(h: int = 96, w: int = 128, seed: int = 0) -> np.ndarray:
    """Sky gradient over dark ground, with texture: enough structure for contrast to mean something."""
    rng = np.random.default_rng(seed)
    img = np.empty((h, w, 3), dtype=np.float64)
    img[: h // 2] = np.linspace([90, 150, 230], [170, 200, 240], h // 2)[:, None, :]
    img[h // 2:] = [90, 110, 80]
    img[h // 3: 2 * h // 3, w // 4: w // 2] = [180, 60, 50]
    return np.clip(img + rng.normal(0, 15, img.shape), 0, 255).astype(np.uint8)


def mad(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int64) - b.astype(np.int64)).mean())


def contrast(img: np.ndarray) -> float:
    return float(img.astype(np.float64).mean(axis=2).std())  # RMS contrast of the luminance


def test_thirteen_paper_conditions():
    assert len(WEATHER_CONDITIONS) == 13 and WEATHER_CONDITIONS[0] == ("clear", 0)
    assert set(WEATHER_CONDITIONS[1:]) == {(w, i) for w in EFFECTS for i in (25, 50, 75, 100)}
    assert [condition_index(w, i) for w, i in WEATHER_CONDITIONS] == list(range(13))
    with pytest.raises(ValueError, match=r"\('fog', 0\)"):
        condition_index("fog", 0)


@pytest.mark.parametrize("condition", ("clear", *EFFECTS))
def test_zero_intensity_is_identity(condition: str):
    img = scene()
    out = apply_weather(img, condition, 0, seed=3)
    np.testing.assert_array_equal(out, img)
    assert out is not img


@pytest.mark.parametrize("condition", EFFECTS)
@pytest.mark.parametrize("seed", (0, 1, 2))
def test_change_grows_with_intensity(condition: str, seed: int):
    img = scene(seed=seed)
    outs = [apply_weather(img, condition, level, seed=seed) for level in LEVELS]
    diffs = [mad(o, img) for o in outs]
    assert (np.diff(diffs) > 0).all(), diffs
    contrasts = [contrast(o) for o in outs]
    assert (np.diff(contrasts) < 0).all(), contrasts  # every effect washes the scene out
    means = [o.mean() for o in outs]
    if condition == "fog":  # towards a bright haze
        assert (np.diff(means) > 0).all(), means
    else:  # overcast and rain darken
        assert (np.diff(means) < 0).all(), means


def test_fog_is_denser_far_away():
    img = np.full((100, 80, 3), 40, dtype=np.uint8)
    out = apply_weather(img, "fog", 60, seed=0).astype(np.float64)
    assert out[:20].mean() > out[40:60].mean() > out[80:].mean() > 40


def test_cloud_tint_is_cool_and_follows_channel_order():
    img = np.full((64, 64, 3), 128, dtype=np.uint8)
    rgb = apply_weather(img, "cloud", 100, seed=0).astype(np.float64)
    assert rgb[..., 2].mean() > rgb[..., 0].mean()  # blue above red
    bgr = apply_weather(img, "cloud", 100, seed=0, channel_order="bgr")
    np.testing.assert_array_equal(bgr[..., ::-1], rgb.astype(np.uint8))


def test_rain_streaks_are_nested_and_brighten_a_growing_area():
    img = np.full((120, 160, 3), 30, dtype=np.uint8)
    lit = [apply_weather(img, "rain", level, seed=5).mean(axis=2) > 45 for level in (25, 50, 100)]
    assert 0 < lit[0].sum() < lit[1].sum() < lit[2].sum()
    assert (lit[0] <= lit[2]).mean() > 0.99  # a heavier rain keeps the streaks of a lighter one


@pytest.mark.parametrize("condition", EFFECTS)
def test_seeded_and_shape_preserving(condition: str):
    img = scene(57, 83)
    a = apply_weather(img, condition, 50, seed=11)
    b = apply_weather(img, condition, 50, seed=11)
    c = apply_weather(img, condition, 50, seed=12)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.dtype == np.uint8 and a.shape == img.shape
    tiny = apply_weather(np.zeros((1, 1, 3), dtype=np.uint8), condition, 100, seed=0)
    assert tiny.shape == (1, 1, 3) and tiny.dtype == np.uint8


def test_bad_inputs_name_the_value():
    img = scene()
    with pytest.raises(ValueError, match="'snow'"):
        apply_weather(img, "snow", 50)
    with pytest.raises(ValueError, match="'Fog'"):
        apply_weather(img, "Fog", 50)
    with pytest.raises(ValueError, match="150"):
        apply_weather(img, "fog", 150)
    with pytest.raises(ValueError, match="-1"):
        apply_weather(img, "rain", -1)
    with pytest.raises(ValueError, match="clear"):
        apply_weather(img, "clear", 50)
    with pytest.raises(ValueError, match="float32"):
        apply_weather(img.astype(np.float32), "fog", 50)
    with pytest.raises(ValueError, match=r"\(96, 128\)"):
        apply_weather(img[..., 0], "fog", 50)
    with pytest.raises(ValueError, match="'xyz'"):
        apply_weather(img, "fog", 50, channel_order="xyz")
