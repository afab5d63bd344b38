"""algorithm=resfl_robust on Adult through the real round loop: the root split is carved out of the reserve, the
weights are capped, and a lying attacker's report does not change them (mode=server)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from resfl_lightning.aggregation.resfl_robust import RobustResfl
from resfl_lightning.train import CONF_DIR


class _Spy:
    def __init__(self):
        self.weights, self.reports = [], []

    def on_round_end(self, reports, weights):
        self.reports.append(list(reports))
        self.weights.append(dict(weights))


def _run(tmp_path, adult_dir, name, *overrides):
    from resfl_lightning.builders import build_run

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["dataset=adult", f"dataset.root={adult_dir}", "algorithm=resfl_robust",
                                          "logger=none", "progress=false", "federation.rounds=2", "eval.every=100",
                                          f"run_dir={tmp_path / name}", *overrides])
    job = build_run(cfg)
    reserve_before = np.asarray(job.federation.data.splits.reserve).copy()
    spy = _Spy()
    job.federation.fabric._callbacks.append(spy)
    job.fit()
    torch.set_num_threads(1)
    return spy, job.federation, reserve_before


def test_resfl_robust_carves_the_root_caps_weights_and_ignores_lies(tmp_path, adult_dir):
    attack = ["attack=byzantine", "attack.byzantine.fraction=0.25"]
    honest, fed, reserve = _run(tmp_path, adult_dir, "honest", *attack, "attack.byzantine.report=honest")
    rule = fed.aggregator
    assert isinstance(rule, RobustResfl)
    root = rule.root.indices
    assert len(root) == 100 and np.isin(root, reserve).all()
    assert not np.isin(root, fed.data.splits.reserve).any()  # MIA / AIA draw from what is left
    assert len(fed.data.splits.reserve) == len(reserve) - 100
    cap = rule.cap(4)
    for w in honest.weights:
        assert sum(w.values()) == pytest.approx(1.0) and max(w.values()) <= cap + 1e-12
    lie, _, _ = _run(tmp_path, adult_dir, "lie", *attack, "attack.byzantine.report=lie")
    attackers = fed.update_transforms[0].attackers(0)
    assert all(r.u == 0.0 for r in lie.reports[0] if r.client_id in attackers)  # the lie was told ...
    for w_h, w_l in zip(honest.weights, lie.weights):  # ... and bought nothing
        assert w_h == pytest.approx(w_l, abs=1e-12)


def test_a_root_split_is_capped_at_half_the_reserve_with_a_warning():
    """On a small dataset (the built-in benchmark's 36-image reserve) root_size=100 ended the run; and a root split
    near the reserve's size would leave the privacy attacks a handful of items. Capped at half, with a warning."""
    import dataclasses
    from types import SimpleNamespace

    import numpy as np

    from resfl_lightning.federation.root import ServerRoot

    @dataclasses.dataclass
    class Splits:
        reserve: np.ndarray

    def federation(n_reserve):
        data = SimpleNamespace(splits=Splits(np.arange(n_reserve)), loader_for=lambda idx: list(idx))
        return SimpleNamespace(data=data, fabric=None, settings=SimpleNamespace(seed=0))

    small = federation(120)
    with pytest.warns(RuntimeWarning, match="capped at 60"):
        root = ServerRoot(small, None, None, size=100)
    assert len(root.indices) == 60 and len(small.data.splits.reserve) == 60
    fed = federation(1500)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        root = ServerRoot(fed, None, None, size=100)
    assert len(root.indices) == 100 and len(fed.data.splits.reserve) == 1400
    assert not set(root.indices) & set(fed.data.splits.reserve)
