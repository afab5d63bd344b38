"""The goal cells `resfl bench` prints beside its measurements (issue 27's targets): met exactly at the target."""

from __future__ import annotations

from resfl_lightning.benchmarks.round import _verdict_s
from resfl_lightning.benchmarks.scale import scale_goal


def test_the_10000_client_row_carries_both_goals_and_the_others_none():
    assert scale_goal(10000, 1.15, 1.5) == "s/step <= 1.15x: met, RSS <= 1.50x: met"
    assert scale_goal(10000, 1.16, 1.2) == "s/step <= 1.15x: not met, RSS <= 1.50x: met"
    assert scale_goal(1000, 9.0, 9.0) == "-"


def test_startup_goals_in_seconds():
    assert _verdict_s(2.5, 2.5) == "<= 2.5 s: met"
    assert _verdict_s(2.51, 2.5) == "<= 2.5 s: not met"
    assert _verdict_s(float("nan"), 1.5) == "n/a"
