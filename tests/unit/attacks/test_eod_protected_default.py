"""attack.eod.protected_group=null without a poisoning attack (dataset=csv's default) takes the smallest group of
the data instead of stopping the run: the README's own `resfl table --dataset csv` example failed on every method."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from resfl_lightning.attacks.robustness_attacks import EqualizedOdds
from resfl_lightning.attacks.targets import minority_group
from resfl_lightning.data.tabular import federated_tabular_data
from resfl_lightning.evaluation.evaluation_pass import EvaluationPass


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


def test_with_a_minimum_group_size_the_protected_default_is_a_group_the_metrics_measure(capsys):
    """metrics.min_group_size: the smallest group overall (1) has 10 test rows, too few to be measured, so the
    default protected group is the smallest of the others; when no group is measured, all are candidates."""
    groups = np.array([1] * 10 + [2] * 60 + [0] * 130 + [0] * 400 + [2] * 300 + [1] * 100)  # test: the first 200
    data = tabular(groups)
    assert minority_group(data) == 1
    assert minority_group(data, min_test_size=30) == 2
    assert minority_group(data, min_test_size=500) == 1
    run = SimpleNamespace(settings={}, evaluation=SimpleNamespace(min_group_size=30))
    eod = EqualizedOdds.build(EqualizedOdds.Settings(protected_group=None), run)
    eod.on_fit_start(SimpleNamespace(data=data, fabric=SimpleNamespace(is_global_zero=True)))
    assert eod.protected == 2 and "metrics.min_group_size=30" in capsys.readouterr().out


def test_eod_of_a_protected_group_the_metrics_leave_out_is_undefined_and_says_why():
    evaluated = EvaluationPass(3, None, {}, groups_excluded={1: 10})
    evaluation = SimpleNamespace(min_group_size=30, evaluation_pass=lambda r: evaluated)
    eod = EqualizedOdds(protected_group=1, evaluation=evaluation)
    metrics: dict = {}
    fed = SimpleNamespace(fabric=SimpleNamespace(is_global_zero=True), data=None)
    with pytest.warns(UserWarning, match="group 1 has 10 units in the test split, fewer than metrics.min_group_size"):
        eod.on_round_end(fed, 3, None, metrics)
    assert metrics == {}
