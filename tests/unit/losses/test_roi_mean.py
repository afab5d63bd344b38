"""losses/roi_mean.py: the separable box mean equals torchvision's aligned roi_align followed by the mean over its
bins, in value and in the gradient it sends to the feature maps (float64, to rounding), for every kind of box the
detector can hand it: inside, on and past the map's border, degenerate, inverted, outside, with adaptive and fixed
sampling; and roi_pool_features / the algorithm setting select it."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import roi_align

from resfl_lightning.clients.base import AdversarySettings
from resfl_lightning.losses.adversary import roi_pool_features
from resfl_lightning.losses.roi_mean import roi_box_mean, slot_in_image

SPECIAL = torch.tensor([[10, 10, 10, 10.0],  # a point
                        [30, 30, 20, 25.0],  # inverted corners
                        [-50, -50, -30, -30.0],  # wholly outside the map
                        [0, 0, 128, 128.0],  # the whole image
                        [120, 3, 140, 60.0],  # across the right border
                        [-3, -3, 4, 4.0]])  # across the top-left corner


def _case(h: int, w: int, seed: int, dtype=torch.float64, boxes: int = 30, images: int = 3):
    g = torch.Generator().manual_seed(seed)
    fmap = torch.randn(images, 4, h, w, generator=g, dtype=dtype)
    xy = torch.rand(boxes, 2, generator=g, dtype=dtype) * 150 - 20
    wh = torch.rand(boxes, 2, generator=g, dtype=dtype) * 90
    corners = torch.cat([torch.cat([xy, xy + wh], 1), SPECIAL.to(dtype)])
    image = torch.randint(0, images, (corners.shape[0], 1), generator=g).to(dtype)  # unsorted, some images boxless
    return fmap, torch.cat([image, corners], 1)


def _reference(fmap, rois, scale, size, sampling):
    return roi_align(fmap, rois, size, scale, sampling, aligned=True).mean((2, 3))


@pytest.mark.parametrize("size, sampling", [(7, -1), (7, 2), (1, 2), (1, 14), (3, -1)])
@pytest.mark.parametrize("h, w, scale", [(16, 16, 1 / 8), (8, 12, 1 / 16), (4, 4, 1 / 32), (1, 3, 1 / 32)])
def test_value_and_gradient_equal_roi_align_then_the_mean(size, sampling, h, w, scale):
    for seed in range(3):
        fmap, rois = _case(h, w, seed)
        ours_in, ref_in = fmap.clone().requires_grad_(), fmap.clone().requires_grad_()
        ours, ref = roi_box_mean(ours_in, rois, scale, size, sampling), _reference(ref_in, rois, scale, size, sampling)
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
        upstream = torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed), dtype=ref.dtype)
        (ours * upstream).sum().backward()
        (ref * upstream).sum().backward()
        torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-12, atol=1e-12)


def test_float32_agrees_to_rounding_and_no_boxes_give_no_rows():
    fmap, rois = _case(16, 16, 0, dtype=torch.float32)
    torch.testing.assert_close(roi_box_mean(fmap, rois, 1 / 8), _reference(fmap, rois, 1 / 8, 7, -1),
                               rtol=1e-5, atol=1e-6)
    fmap.requires_grad_()
    empty = roi_box_mean(fmap, rois[:0], 1 / 8)
    assert empty.shape == (0, 4)
    empty.sum().backward()
    assert fmap.grad is None or not fmap.grad.any()


def test_bfloat16_maps_are_pooled_in_float32_like_roi_align_under_autocast():
    fmap, rois = _case(16, 16, 2, dtype=torch.float32)
    ours = roi_box_mean(fmap.bfloat16(), rois, 1 / 8)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, _reference(fmap.bfloat16().float(), rois, 1 / 8, 7, -1), rtol=1e-5, atol=1e-6)


def test_each_box_gets_its_place_among_its_own_images_boxes():
    image = torch.tensor([2, 0, 2, 2, 1, 0])
    assert slot_in_image(image, 4).tolist() == [0, 0, 1, 2, 0, 1]


def test_roi_pool_features_selects_the_implementation():
    g = torch.Generator().manual_seed(1)
    strides = [8, 16, 32]
    maps = [torch.randn(2, 3, 128 // s, 128 // s, generator=g, dtype=torch.float64) for s in strides]
    boxes = torch.tensor([[5, 5, 60, 90], [40, 10, 120, 50], [0, 0, 128, 128.0]], dtype=torch.float64)
    idx = torch.tensor([1, 0, 1])
    exact = roi_pool_features(maps, strides, boxes, idx)
    torch.testing.assert_close(roi_pool_features(maps, strides, boxes, idx, impl="separable"), exact,
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="impl must be one of"):
        roi_pool_features(maps, strides, boxes, idx, impl="fast")


def test_the_setting_reaches_phi_and_bad_values_are_refused():
    from resfl_lightning.algorithms.base import Algorithm
    from resfl_lightning.analysis.run_settings import composed_settings

    a = composed_settings(["algorithm=resfl", "algorithm.adversary_roi_impl=roi_align"])["algorithm"]
    assert Algorithm(**{k: v for k, v in a.items() if k in Algorithm.__dataclass_fields__}).adversary(10).roi_impl \
        == "roi_align"
    assert composed_settings(["algorithm=resfl"])["algorithm"]["adversary_roi_impl"] == "separable"  # the default
    assert AdversarySettings().roi_impl == "separable"  # and in code (clients built without a config)
    with pytest.raises(ValueError, match="impl must be one of"):
        AdversarySettings(roi_impl="fast")


@pytest.mark.parametrize(("dataset", "stale"), [("adult", False), ("synthetic", True)])
def test_a_run_saved_with_roi_align_is_stale_only_where_boxes_are_pooled(tmp_path, dataset: str, stale: bool):
    """The default moved to separable on 2026-11-29: a detection run saved with roi_align is another run (its model
    differs in the last bits), a tabular run saved with it is the run composed now (its client pools no box)."""
    from omegaconf import OmegaConf

    from resfl_lightning.analysis.run_settings import composed_settings, finished_run_mismatch

    overrides = [f"dataset={dataset}", "logger=none"]
    saved = composed_settings(overrides)
    saved["algorithm"]["adversary_roi_impl"] = "roi_align"
    OmegaConf.save(OmegaConf.create(saved), tmp_path / "config.yaml")
    expected = ["algorithm.adversary_roi_impl: roi_align -> separable"] if stale else []
    assert finished_run_mismatch(tmp_path, overrides) == expected
    saved["algorithm"]["lambda_priv"] = 0.5  # any other key still counts on either task
    OmegaConf.save(OmegaConf.create(saved), tmp_path / "config.yaml")
    assert "algorithm.lambda_priv: 0.5 -> 0.1" in finished_run_mismatch(tmp_path, overrides)


@pytest.mark.parametrize("preset", ["table_synthetic", "table_synthetic_v1"])
def test_the_detection_table_presets_keep_roi_align(preset: str):
    """Their published runs and tune trials pooled through roi_align: the pin keeps them the runs the presets make."""
    from resfl_lightning.analysis.run_settings import composed_settings

    settings = composed_settings(["dataset=synthetic", f"experiment={preset}", "algorithm=resfl"])
    assert settings["algorithm"]["adversary_roi_impl"] == "roi_align"
    assert composed_settings(["dataset=synthetic", "algorithm=resfl"])["algorithm"]["adversary_roi_impl"] == "separable"
