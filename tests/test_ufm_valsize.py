"""se_and_spread_by_size: the validation-size measurement of UFM's noise against its spread across clients."""

from __future__ import annotations

import numpy as np
import pytest

from resfl_lightning.metrics.ufm import ufm_from_units
from resfl_lightning.ufm_valsize import se_and_spread_by_size


def test_identical_images_have_no_noise_and_the_spread_is_the_clients_ufm_std():
    # every image of a client carries the same group evidence: any subset has the client's UFM, the SE is 0
    units = {0: [{0: 4.0, 1: 2.0}] * 30, 1: [{0: 4.0, 1: 4.0}] * 30, 2: [{0: 2.0, 1: 4.0}] * 30}
    per_client = [ufm_from_units(v).ufm for v in units.values()]
    rows = se_and_spread_by_size(units, sizes=[5, 20, 31], draws=3)
    assert [r["n"] for r in rows] == [5, 20]  # 31 is more images than a client has
    for r in rows:
        assert r["se"] == pytest.approx(0.0, abs=1e-12)
        assert r["spread"] == pytest.approx(np.std(per_client)) and r["se_over_spread"] == pytest.approx(0.0)


def test_more_validation_images_shrink_the_bootstrap_se():
    rng = np.random.default_rng(1)
    units = {c: [{0: float(rng.gamma(4.0)), 1: float(rng.gamma(2.0 + c))} for _ in range(400)] for c in range(4)}
    rows = se_and_spread_by_size(units, sizes=[25, 100, 400], draws=4)
    se = [r["se"] for r in rows]
    assert se[0] > se[1] > se[2] > 0
    assert se[2] == pytest.approx(se[0] / 4, rel=0.35)  # ~1/sqrt(n): 16x the images, a quarter of the SE
