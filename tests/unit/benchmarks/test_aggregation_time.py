"""`resfl bench aggregation` times a rule after one untimed round: a first call that pays a one-off cost (CUDA's
kernel loading, the allocator growing) is not what the table reports."""

from __future__ import annotations

import time

import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.benchmarks.aggregation_time import time_rule


class _SlowFirstCall(GatherAllRule):
    calls = 0

    def aggregate(self, deltas, reports):
        _SlowFirstCall.calls += 1
        if _SlowFirstCall.calls == 1:
            time.sleep(0.5)
        return deltas.mean(0)


def test_the_first_call_of_a_rule_is_not_timed():
    _SlowFirstCall.calls = 0
    seconds = time_rule(_SlowFirstCall, torch.zeros(3, 4), repeats=1)
    assert _SlowFirstCall.calls == 2  # one untimed round, then the timed one
    assert seconds < 0.25
