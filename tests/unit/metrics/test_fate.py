"""FATE on hand-computed cases and its errors for zero baselines."""

from __future__ import annotations

import pytest

from resfl_lightning.metrics.fate import fate


def test_fate_hand_computed():
    # At CurvFed's printed 10x scale: (0.85 - 0.80)/0.80 = 0.0625; (0.10 - 0.05)/0.10 = 0.5.
    assert fate(0.85, 0.80, 0.05, 0.10) == pytest.approx(5.625)
    assert fate(0.85, 0.80, 0.05, 0.10, lambda_f=0.5) == pytest.approx(3.125)
    # Worse accuracy and a larger EO gap than the baseline: (0.72-0.8)/0.8 = -0.1; (0.1-0.15)/0.1 = -0.5.
    assert fate(0.72, 0.80, 0.15, 0.10) == pytest.approx(-6.0)
    assert fate(0.8, 0.8, 0.1, 0.1) == 0.0


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        ((0.8, 0.0, 0.1, 0.2), "acc_b"),
        ((0.8, 0.7, 0.1, 0.0), "eo_b"),
        ((0.8, 0.7, 1.5, 0.2), "eo_f"),
        ((float("nan"), 0.7, 0.1, 0.2), "acc_f"),
    ],
)
def test_fate_errors_name_the_argument(args, msg):
    with pytest.raises(ValueError, match=msg):
        fate(*args)
