"""FairFed's server weights (Ezzeldin et al. 2023) against hand-computed cases and its defining direction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from resfl_lightning.aggregation.fairfed import WEIGHTS_KEY, FairFed, fairfed_update, fairness_gaps, group_metric
from resfl_lightning.federation.checkpoint import ServerState
from resfl_lightning.types import ClientReport


def report(cid: int) -> ClientReport:
    return ClientReport(client_id=cid, num_samples=10, ufm_raw=0.0, ufm_ema=0.0, u=0.0, gated=False,
                        val_utility=0.5, val_utility50=0.5, eval_loss=1.0)


def test_group_metric_is_the_signed_eod_of_two_groups_and_the_mean_gap_of_more():
    both = np.array([0, 1])
    assert group_metric([8, 3], [10, 6], both) == pytest.approx(0.8 - 0.5)
    assert group_metric([3, 8], [6, 10], both) == pytest.approx(0.5 - 0.8)  # signed
    # three groups: TPR 0.8, 0.5, 0.25, pooled 12/20 = 0.6 -> mean(|0.2|, |0.1|, |0.35|) = 0.65 / 3
    assert group_metric([8, 3, 1], [10, 6, 4], np.array([0, 1, 2])) == pytest.approx(0.65 / 3)


def test_gaps_use_the_global_metric_from_summed_counts():
    acc = np.array([0, 1])  # unused while every client holds both groups
    stats = {0: (np.array([9, 1]), np.array([10, 2]), acc), 1: (np.array([5, 5]), np.array([10, 10]), acc)}
    # global TPR = (14/20, 6/12) = (0.7, 0.5): F_g = +0.2; client 0: 0.9 - 0.5 = +0.4; client 1: 0
    gaps = fairness_gaps(stats)
    assert gaps[0] == pytest.approx(0.2) and gaps[1] == pytest.approx(0.2)
    # signed: client 1 with TPR (0.5, 0.7) has F = -0.2; the global (14/20, 8/12) F_g = 0.7 - 2/3
    stats[1] = (np.array([5, 7]), np.array([10, 10]), acc)
    gaps = fairness_gaps(stats)
    f_g = 14 / 20 - 8 / 12
    assert gaps[0] == pytest.approx(abs(f_g - 0.4)) and gaps[1] == pytest.approx(abs(f_g + 0.2))
    # an unsigned max - min gap would give client 1 |0.2 - f_g| instead
    assert abs(gaps[1] - abs(0.2 - f_g)) > 0.05


def test_a_client_missing_a_group_uses_the_accuracy_gap():
    stats = {0: (np.array([9, 1]), np.array([10, 2]), np.array([80, 100])),
             1: (np.array([6, 0]), np.array([10, 0]), np.array([45, 50]))}  # client 1: no positive of group 1
    gaps = fairness_gaps(stats)
    acc_global = (80 + 45) / 150
    assert gaps[1] == pytest.approx(abs(acc_global - 0.9))
    f_g = 15 / 20 - 1 / 2
    assert gaps[0] == pytest.approx(abs(f_g - (0.9 - 0.5)))


def test_omega_update_by_hand():
    initial = {0: 0.4, 1: 0.3, 2: 0.2, 3: 0.1}
    gaps = {0: 0.0, 1: 0.1, 2: 0.1, 3: 0.4}
    # mean gap 0.15: omega_k = omega_k^0 - 0.2 (gap_k - 0.15) = 0.43, 0.31, 0.21, 0.05
    new = fairfed_update(initial, gaps, 0.2, initial)
    assert [new[k] for k in range(4)] == pytest.approx([0.43, 0.31, 0.21, 0.05])
    assert fairfed_update(initial, gaps, 0.0, initial) == pytest.approx(initial)  # beta = 0: FedAvg
    # beta = 1: 0.55, 0.35, 0.25, -0.15 -> clamped at 0, not renormalised (the weights are omega / sum omega)
    clamped = fairfed_update(initial, gaps, 1.0, initial)
    assert [clamped[k] for k in range(4)] == pytest.approx([0.55, 0.35, 0.25, 0.0])
    # one omega at 0 stays there (0.05 - 0.1 < 0); every omega driven to 0 falls back to n_k / n
    assert fairfed_update({0: 0.05, 1: 0.05}, {0: 0.0, 1: 0.2}, 1.0, {0: 0.6, 1: 0.4}) == pytest.approx(
        {0: 0.15, 1: 0.0})
    assert fairfed_update({0: 0.0, 1: 0.0}, {0: 0.1, 1: 0.1}, 1.0, {0: 0.6, 1: 0.4}) == pytest.approx(
        {0: 0.6, 1: 0.4})


def test_prepare_starts_from_sample_shares_and_carries_omega_across_rounds():
    agg = FairFed(beta=0.5)
    stats = {0: (np.array([9, 1]), np.array([10, 2]), np.array([8, 10])),
             1: (np.array([6, 3]), np.array([10, 6]), np.array([7, 10]))}
    state = ServerState(round_idx=0, theta=torch.zeros(1), int_buffers={})
    state = agg.prepare(state, stats, {0: 30, 1: 10})
    # F_g = 15/20 - 4/8 = 0.25; F_0 = 0.4, F_1 = 0.1: gaps 0.15, 0.15 -> omega unchanged = (0.75, 0.25)
    assert agg.weights_now == pytest.approx({0: 0.75, 1: 0.25})
    stats[1] = (np.array([6, 0]), np.array([10, 0]), np.array([7, 10]))  # client 1 lacks group 1 now
    state = agg.prepare(state, stats, {0: 30, 1: 10})
    # F_g = 15/20 - 1/2 = 0.25, gap_0 = |0.25 - 0.4| = 0.15; acc: global 15/20, client 1 0.7: gap_1 = 0.05
    # omega = 0.75 - 0.5 (0.15 - 0.1), 0.25 - 0.5 (0.05 - 0.1) = 0.725, 0.275 (sum 1)
    assert state.extra[WEIGHTS_KEY].tolist() == pytest.approx([0.725, 0.275])
    weights = agg.weights([report(0), report(1)])
    assert [weights[0], weights[1]] == pytest.approx([0.725, 0.275])


def test_zero_weight_client_contributes_nothing():
    from resfl_lightning.aggregation.streaming import StreamingWeightedSum

    acc = StreamingWeightedSum(2)
    acc.add(-math.inf, torch.tensor([100.0, 100.0]))
    acc.add(math.log(1.0), torch.tensor([1.0, 2.0]))
    gmax, gnorm = acc.max_score, acc.normaliser
    assert acc.rescale_for_global(gmax, gnorm).tolist() == [1.0, 2.0]
