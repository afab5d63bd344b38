"""The goal cells `resfl bench` prints beside its measurements (docs/performance.md): met exactly at the target."""

from __future__ import annotations

from resfl_lightning.benchmarks.goals import goal_verdict
from resfl_lightning.benchmarks.scale import scale_goal


def test_the_10000_client_row_carries_both_goals_and_the_others_none():
    assert scale_goal(10000, 1.15, 1.5) == "s/step <= 1.15x: met, RSS <= 1.50x: met"
    assert scale_goal(10000, 1.16, 1.2) == "s/step <= 1.15x: not met, RSS <= 1.50x: met"
    assert scale_goal(1000, 9.0, 9.0) == "-"


def test_startup_goals_in_seconds():
    assert goal_verdict(2.5, 2.5, unit="s") == "<= 2.5 s: met"
    assert goal_verdict(2.51, 2.5, unit="s") == "<= 2.5 s: not met"
    assert goal_verdict(float("nan"), 1.5, unit="s") == "n/a"


def test_ratio_goals_at_most_and_at_least():
    assert goal_verdict(1.08, 1.08) == "<= 1.08x: met" and goal_verdict(1.09, 1.08) == "<= 1.08x: not met"
    assert goal_verdict(1.8, 1.8, at_most=False) == ">= 1.80x: met"
    assert goal_verdict(1.79, 1.8, at_most=False) == ">= 1.80x: not met"
