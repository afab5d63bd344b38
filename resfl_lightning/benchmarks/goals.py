"""The goal cell `resfl bench` prints beside a measurement (the speed goals of docs/performance.md): one wording for
every table."""

from __future__ import annotations

import math


def goal_verdict(value: float, target: float, at_most: bool = True, unit: str = "x") -> str:
    """'<= 1.08x: met', '>= 1.80x: not met', '<= 2.5 s: met' (unit "s": seconds, one decimal); 'n/a' for NaN."""
    if not math.isfinite(value):
        return "n/a"
    ok = value <= target if at_most else value >= target
    bound = f"{target:.2f}x" if unit == "x" else f"{target:.1f} {unit}"
    return f"{'<=' if at_most else '>='} {bound}: {'met' if ok else 'not met'}"
