"""BA AD, the relative utility drop of an attacked run."""

from __future__ import annotations

import pytest

from resfl_lightning.metrics.robustness import relative_drop


def test_relative_drop():
    assert relative_drop(0.40, 0.30) == pytest.approx(0.25)
    assert relative_drop(0.40, 0.50) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="clean metric is 0"):
        relative_drop(0.0, 0.1)
