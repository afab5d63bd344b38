"""attack.eod.protected_group=null without a poisoning attack (dataset=csv's default) takes the smallest group of
the data instead of stopping the run: the README's own `resfl table --dataset csv` example failed on every method."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from resfl_lightning.attacks.robustness_attacks import EqualizedOdds
from resfl_lightning.attacks.targets import minority_group
from resfl_lightning.data.tabular import federated_tabular_data


def tabular(groups_train: np.ndarray):
    rng = np.random.default_rng(0)
    n = len(groups_train)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = rng.integers(0, 2, n)
    return federated_tabular_data(x, y, groups_train, x[:200], y[:200], groups_train[:200], num_groups=3,
                                  num_clients=2, partition="iid", dirichlet_alpha=0.5, reserve_fraction=0.05,
                                  val_fraction=0.1, batch_size=32, eval_batch_size=64, seed=0)


def test_minority_group_is_the_group_with_fewest_items():
    groups = np.array([0] * 500 + [1] * 120 + [2] * 380)
    data = tabular(np.random.default_rng(1).permutation(groups))
    assert minority_group(data) == 1
    assert minority_group(tabular(np.array([2] * 300 + [0] * 80 + [1] * 620))) == 0


def test_eod_with_null_protected_group_resolves_at_fit_start(capsys):
    data = tabular(np.array([0] * 500 + [1] * 380 + [2] * 120))
    run = SimpleNamespace(settings={}, evaluation=None)
    eod = EqualizedOdds.build(EqualizedOdds.Settings(protected_group=None), run)
    eod.on_fit_start(SimpleNamespace(data=data, fabric=SimpleNamespace(is_global_zero=True)))
    assert eod.protected == 2
    assert "smallest group" in capsys.readouterr().out
