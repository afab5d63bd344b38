"""Synthetic street-scene benchmark: determinism, box geometry, MST imbalance, dim/dark correlation, cache."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy import stats

from resfl_lightning.data.detection import AnnotatedImages
from resfl_lightning.data.mst import group_of_mst
from resfl_lightning.data.synthetic import SyntheticSceneConfig, generate_scenes, mst_probabilities, render_scene

SMALL = SyntheticSceneConfig(image_size=64)


def _xyxy_px(box: np.ndarray, size: int) -> np.ndarray:
    cx, cy, w, h = box * size
    return np.array([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])


def test_same_seed_same_scenes_and_image_independent_of_set_size():
    cfg = SyntheticSceneConfig()
    a, b = generate_scenes(cfg, 10, seed=3), generate_scenes(cfg, 10, seed=3)
    np.testing.assert_array_equal(a.images, b.images)
    for name in ("image_index", "boxes", "groups", "proxy"):
        np.testing.assert_array_equal(getattr(a.annotations, name), getattr(b.annotations, name))
    np.testing.assert_array_equal(a.mst, b.mst)
    big = generate_scenes(cfg, 100, seed=3)
    np.testing.assert_array_equal(big.images[:10], a.images)
    head = big.annotations.image_index < 10
    np.testing.assert_array_equal(big.annotations.boxes[head], a.annotations.boxes)
    np.testing.assert_array_equal(big.mst[head], a.mst)
    np.testing.assert_array_equal(big.dim[:10], a.dim)
    other = generate_scenes(cfg, 10, seed=4)
    assert not np.array_equal(other.images, a.images)


def test_scene_set_is_a_consistent_annotated_image_source():
    cfg = dataclasses.replace(SMALL, grouping="mst3")
    scenes = generate_scenes(cfg, 50, seed=0)
    assert isinstance(scenes, AnnotatedImages) and len(scenes) == 50
    assert scenes.images.shape == (50, 64, 64, 3) and scenes.images.dtype == np.uint8
    ann = scenes.annotations
    assert len(ann) > 50 and np.all(ann.cls == 0)
    np.testing.assert_array_equal(ann.groups, group_of_mst(scenes.mst, "mst3"))
    np.testing.assert_array_equal(ann.proxy, scenes.dim[ann.image_index].astype(int))
    assert set(np.unique(scenes.mst)) <= set(range(1, 11))
    np.testing.assert_array_equal(scenes.load_image(7), scenes.images[7])


def test_boxes_inside_image_and_not_degenerate():
    cfg = SyntheticSceneConfig(min_persons=2, max_persons=5, min_box_size=4)
    scenes = generate_scenes(cfg, 150, seed=1)
    s = cfg.image_size
    xyxy = np.stack([_xyxy_px(b, s) for b in scenes.annotations.boxes])
    assert np.all(xyxy[:, :2] >= -1e-3) and np.all(xyxy[:, 2:] <= s + 1e-3)
    widths, heights = xyxy[:, 2] - xyxy[:, 0], xyxy[:, 3] - xyxy[:, 1]
    assert np.all(widths >= cfg.min_box_size - 1e-3) and np.all(heights >= cfg.min_box_size - 1e-3)
    assert np.allclose(xyxy, np.round(xyxy), atol=1e-3)  # boxes are pixel-aligned visible extents
    assert heights.max() > 0.4 * s and np.median(heights) > 0.15 * s  # persons span the configured scale range


def test_box_is_the_visible_extent_of_the_person_pixels():
    """Independent mask: render each scene with and without the person layers; the changed pixels are the person."""
    single = SyntheticSceneConfig(min_persons=1, max_persons=1, min_box_size=1, dim_probability=0.0,
                                  dark_dim_correlation=0.0)
    s = single.image_size
    slacks = []
    for i in range(40):
        with_p, without = render_scene(single, 11, i), render_scene(single, 11, i, draw_persons=False)
        changed = (with_p.image != without.image).any(2)
        if len(with_p.boxes) == 0:  # person fully outside the image or hidden by an occluder
            assert not changed.any()
            continue
        ys, xs = np.nonzero(changed)
        x0, y0, x1, y1 = _xyxy_px(with_p.boxes[0], s)
        slack = np.array([xs.min() - x0, x1 - (xs.max() + 1), ys.min() - y0, y1 - (ys.max() + 1)])
        assert np.all(slack >= -1e-3), f"scene {i}: person pixels outside the box by {slack}"
        assert np.all(slack <= 1 + 1e-3), f"scene {i}: box looser than the person by {slack}"  # AA fringe only
        slacks.append(slack)
    assert len(slacks) >= 30
    assert np.mean(slacks) < 0.1  # tight: a faint AA fringe may leave a pixel unchanged, but rarely
    # Several persons with occlusions: every changed pixel belongs to some box.
    crowd = SyntheticSceneConfig(min_persons=3, max_persons=5, min_box_size=1, occluder_probability=1.0)
    for i in range(15):
        with_p, without = render_scene(crowd, 12, i), render_scene(crowd, 12, i, draw_persons=False)
        inside = np.zeros((s, s), bool)
        for box in with_p.boxes:
            x0, y0, x1, y1 = np.round(_xyxy_px(box, s)).astype(int)
            inside[y0:y1, x0:x1] = True
        changed = (with_p.image != without.image).any(2)
        assert not (changed & ~inside).any(), f"crowd scene {i}: person pixels outside every box"


def test_mst_frequencies_follow_the_configured_imbalance():
    cfg = dataclasses.replace(SMALL, min_persons=3, max_persons=4, imbalance=1.5)
    counts = np.bincount(generate_scenes(cfg, 500, seed=2).mst - 1, minlength=10)
    expected_p = np.exp(-1.5 * np.arange(10) / 9)  # the documented law p_k ~ exp(-imbalance (k-1)/9)
    expected_p /= expected_p.sum()
    np.testing.assert_allclose(mst_probabilities(cfg), expected_p)
    assert stats.chisquare(counts, expected_p * counts.sum()).pvalue > 1e-3
    assert stats.chisquare(counts, np.full(10, counts.sum() / 10)).pvalue < 1e-4  # visibly not uniform
    flat = dataclasses.replace(cfg, imbalance=0.0)
    flat_counts = np.bincount(generate_scenes(flat, 400, seed=2).mst - 1, minlength=10)
    assert stats.chisquare(flat_counts).pvalue > 1e-3
    explicit = dataclasses.replace(cfg, mst_probs=(0, 0, 0, 0, 0, 0, 0, 1, 1, 0))
    assert set(np.unique(generate_scenes(explicit, 30, seed=0).mst)) == {8, 9}


def _dim_rate_by_tone(cfg: SyntheticSceneConfig, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    scenes = generate_scenes(cfg, n, seed)
    groups = group_of_mst(scenes.mst, "mst3")
    dim = scenes.dim[scenes.annotations.image_index]
    return np.array([dim[groups == g].mean() for g in range(3)]), np.array([(groups == g).sum() for g in range(3)])


def test_dark_dim_correlation_knob_changes_conditional_rates():
    base = dataclasses.replace(SMALL, min_persons=1, max_persons=1, imbalance=0.0, dim_probability=0.3,
                               occluder_probability=0.0)
    rate0, n0 = _dim_rate_by_tone(dataclasses.replace(base, dark_dim_correlation=0.0), 600, 5)
    rate1, n1 = _dim_rate_by_tone(dataclasses.replace(base, dark_dim_correlation=0.9), 600, 5)
    # c = 0: P(dim) = 0.3 for every tone. c = 0.9, one person: P(dim | MST m) = 0.1 * 0.3 + 0.9 (m - 1)/9.
    expected1 = np.array([np.mean([0.03 + 0.9 * (m - 1) / 9 for m in ms]) for ms in ([1, 2, 3], [4, 5, 6, 7],
                                                                                   [8, 9, 10])])
    for rate, n, exp in ((rate0, n0, np.full(3, 0.3)), (rate1, n1, expected1)):
        se = np.sqrt(exp * (1 - exp) / n)
        assert np.all(np.abs(rate - exp) < 4 * se), (rate, exp)
    assert rate1[2] - rate1[0] > 0.5 and abs(rate0[2] - rate0[0]) < 0.15

    # The same knob drives dark backgrounds behind dark-toned persons.
    dark = dataclasses.replace(base, mst_probs=(0,) * 9 + (1,), dark_background_probability=0.1)
    bg0 = generate_scenes(dataclasses.replace(dark, dark_dim_correlation=0.0), 300, 6).annotations.extra
    bg1 = generate_scenes(dataclasses.replace(dark, dark_dim_correlation=1.0), 300, 6).annotations.extra
    assert bg0["dark_background"].mean() < 0.2 and bg1["dark_background"].mean() == 1.0


def test_dim_scenes_are_darker():
    scenes = generate_scenes(dataclasses.replace(SMALL, dark_dim_correlation=0.0, dim_probability=0.5), 200, 8)
    brightness = scenes.images.reshape(len(scenes), -1).mean(1)
    assert brightness[scenes.dim].mean() < 0.5 * brightness[~scenes.dim].mean()


def test_disk_cache_round_trip(tmp_path):
    first = generate_scenes(SMALL, 12, seed=9, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1
    again = generate_scenes(SMALL, 12, seed=9, cache_dir=tmp_path)
    np.testing.assert_array_equal(first.images, again.images)
    np.testing.assert_array_equal(first.annotations.boxes, again.annotations.boxes)
    np.testing.assert_array_equal(first.mst, again.mst)
    np.testing.assert_array_equal(first.dim, again.dim)
    generate_scenes(SMALL, 12, seed=10, cache_dir=tmp_path)
    generate_scenes(dataclasses.replace(SMALL, imbalance=2.0), 12, seed=9, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 3


@pytest.mark.parametrize("kwargs", [{"min_persons": 3, "max_persons": 2}, {"imbalance": -1.0},
                                    {"dark_dim_correlation": 1.5}, {"grouping": "mst4"}, {"mst_probs": (1.0, 2.0)},
                                    {"dim_range": (0.0, 0.3)}])
def test_bad_config_raises(kwargs):
    with pytest.raises(ValueError):
        SyntheticSceneConfig(**kwargs)


def test_extra_reserve_images_grow_only_the_reserve(tmp_path):
    from omegaconf import OmegaConf

    from resfl_lightning.data.federated import instantiate_dataset
    from resfl_lightning.train import CONF_DIR

    def build_synthetic(cfg, seed: int):
        return instantiate_dataset(cfg).build(seed)

    base = OmegaConf.load(f"{CONF_DIR}/dataset/synthetic.yaml")  # independent of the working directory
    base.merge_with({"num_images": 60, "image_size": 64, "cache_dir": str(tmp_path)})
    plain = build_synthetic(OmegaConf.merge(base, {"extra_reserve_images": 0}), seed=5)
    grown = build_synthetic(OmegaConf.merge(base, {"extra_reserve_images": 25}), seed=5)
    np.testing.assert_array_equal(grown.splits.test, plain.splits.test)
    for a, b in zip(grown.splits.clients, plain.splits.clients):
        np.testing.assert_array_equal(a.train, b.train)
        np.testing.assert_array_equal(a.val, b.val)
    extra = np.setdiff1d(grown.splits.reserve, plain.splits.reserve)
    np.testing.assert_array_equal(extra, np.arange(60, 85))
    assert len(grown.splits.reserve) == len(plain.splits.reserve) + 25
    # the training pixels are the same scenes; the extra ones are new scenes of the same generator
    np.testing.assert_array_equal(grown.source.images[:60], plain.source.images)
    assert len(grown.source) == 85
