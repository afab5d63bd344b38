"""What an attack costs, from a clean run and its attacked twin (docs/method.md §7)."""

from __future__ import annotations

import math


def relative_drop(clean: float, attacked: float) -> float:
    """BA AD: (clean - attacked) / clean, e.g. the relative mAP drop of the attacked run."""
    clean, attacked = float(clean), float(attacked)
    if not (math.isfinite(clean) and math.isfinite(attacked)):
        raise ValueError(f"relative_drop: non-finite input (clean={clean}, attacked={attacked})")
    if clean == 0.0:
        raise ValueError("relative_drop: clean metric is 0, the relative drop is undefined")
    return (clean - attacked) / clean
