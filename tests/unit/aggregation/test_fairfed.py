"""FairFed's server weights (Ezzeldin et al. 2023) against hand-computed cases and its defining direction."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from resfl_lightning.aggregation.fairfed import WEIGHTS_KEY, FairFed, eop_gap, fairfed_update, fairness_gaps
from resfl_lightning.federation.checkpoint import ServerState
from resfl_lightning.types import ClientReport


def report(cid: int) -> ClientReport:
    return ClientReport(client_id=cid, num_samples=10, ufm_raw=0.0, ufm_ema=0.0, u=0.0, gated=False,
                        val_utility=0.5, val_utility50=0.5, eval_loss=1.0)


def test_eop_gap_hand_cases():
    assert eop_gap([8, 3], [10, 6]) == pytest.approx(0.8 - 0.5)
    assert eop_gap([8, 0], [10, 0]) == 0.0  # one group present: no gap
    assert eop_gap([8, 0], [10, 0], fill=np.array([0.7, 0.4])) == pytest.approx(0.8 - 0.4)


def test_fairness_gaps_use_summed_counts_for_the_global_metric():
    stats = {0: (np.array([9, 1]), np.array([10, 2])), 1: (np.array([5, 5]), np.array([10, 10]))}
    # global TPR = (14/20, 6/12) = (0.7, 0.5): F_g = 0.2; client 0: 0.9 - 0.5 = 0.4; client 1: 0
    gaps = fairness_gaps(stats)
    assert gaps[0] == pytest.approx(0.2) and gaps[1] == pytest.approx(0.2)
    stats[1] = (np.array([6, 3]), np.array([10, 6]))  # client 1: 0.6 - 0.5 = 0.1; global (15/20, 4/8) -> 0.25
    gaps = fairness_gaps(stats)
    assert gaps[0] == pytest.approx(abs(0.25 - 0.4)) and gaps[1] == pytest.approx(abs(0.25 - 0.1))


def test_client_closer_to_global_fairness_gains_weight():
    prev = {0: 0.25, 1: 0.25, 2: 0.25, 3: 0.25}
    gaps = {0: 0.0, 1: 0.1, 2: 0.1, 3: 0.4}
    new = fairfed_update(prev, gaps, beta=0.5)
    assert sum(new.values()) == pytest.approx(1.0)
    assert new[0] > new[1] > new[3] and new[1] == pytest.approx(new[2])
    # hand: mean gap 0.15 -> 0.25 - 0.5 * (gap - 0.15) = 0.325, 0.275, 0.275, 0.125 (sum 1)
    assert [new[k] for k in range(4)] == pytest.approx([0.325, 0.275, 0.275, 0.125])
    assert fairfed_update(prev, gaps, beta=0.0) == pytest.approx(prev)
    clipped = fairfed_update(prev, gaps, beta=10.0)
    assert min(clipped.values()) == 0.0 and sum(clipped.values()) == pytest.approx(1.0)


def test_prepare_starts_from_sample_shares_and_carries_weights_across_rounds():
    agg = FairFed(beta=0.5)
    stats = {0: (np.array([9, 1]), np.array([10, 2])), 1: (np.array([6, 3]), np.array([10, 6]))}
    state = ServerState(round_idx=0, theta=torch.zeros(1), int_buffers={})
    state = agg.prepare(state, stats, {0: 30, 1: 10})
    gaps = fairness_gaps(stats)
    expected = fairfed_update({0: 0.75, 1: 0.25}, gaps, beta=0.5)
    assert agg.weights_now == pytest.approx(expected)
    assert state.extra[WEIGHTS_KEY].tolist() == pytest.approx([expected[0], expected[1]])
    weights = agg.weights([report(0), report(1)])
    assert [weights[0], weights[1]] == pytest.approx([expected[0], expected[1]])
    agg.prepare(state, stats, {0: 30, 1: 10})
    assert agg.weights_now == pytest.approx(fairfed_update(expected, gaps, beta=0.5))


def test_zero_weight_client_contributes_nothing():
    from resfl_lightning.aggregation.streaming import StreamingWeightedSum

    acc = StreamingWeightedSum(2)
    acc.add(-math.inf, torch.tensor([100.0, 100.0]))
    acc.add(math.log(1.0), torch.tensor([1.0, 2.0]))
    gmax, gnorm = acc.max_score, acc.normaliser
    assert acc.rescale_for_global(gmax, gnorm).tolist() == [1.0, 2.0]
