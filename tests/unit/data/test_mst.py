"""MST swatches and MST -> group mapping."""

from __future__ import annotations

import json

import numpy as np
import pytest

from resfl_lightning.data.mst import MST_HEX, MST_RGB, group_of_mst, mst_rgb, num_groups


def test_swatches_match_published_file(shared_data):
    doc = json.loads((shared_data / "mst-swatches.json").read_text())
    swatches = sorted(doc["swatches"], key=lambda s: s["mst"])
    assert [s["mst"] for s in swatches] == list(range(1, 11))
    assert list(MST_HEX) == [s["hex"].lower() for s in swatches]
    np.testing.assert_array_equal(MST_RGB, np.array([s["rgb"] for s in swatches], dtype=np.uint8))
    assert mst_rgb(10) == tuple(swatches[9]["rgb"])


def test_swatches_are_read_only():
    with pytest.raises(ValueError):
        MST_RGB[0, 0] = 0


def test_group_of_mst_10_and_3():
    mst = np.arange(1, 11)
    np.testing.assert_array_equal(group_of_mst(mst, "mst10"), np.arange(10))
    np.testing.assert_array_equal(group_of_mst(mst, "mst3"), [0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    assert num_groups("mst10") == 10 and num_groups("mst3") == 3
    assert group_of_mst(7, "mst3").item() == 1


def test_unknown_tone_maps_to_minus_one():
    np.testing.assert_array_equal(group_of_mst([-1, 4, -1], "mst3"), [-1, 1, -1])
    np.testing.assert_array_equal(group_of_mst(np.array([np.nan, 10.0, 1.0]), "mst10"), [-1, 9, 0])
    assert group_of_mst(np.array([3.0, 9.0]), "mst3").dtype == np.int64


@pytest.mark.parametrize("bad", [[0], [11], [2.5], [-2]])
def test_invalid_mst_values_raise(bad):
    with pytest.raises(ValueError, match="MST"):
        group_of_mst(np.array(bad), "mst10")


def test_unknown_grouping_raises():
    with pytest.raises(ValueError, match="grouping"):
        num_groups("fitzpatrick")
    with pytest.raises(ValueError, match="grouping"):
        group_of_mst([1], "mst5")
