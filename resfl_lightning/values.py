"""The one test of a logged or summarised value that every layer shares: is it a usable number?"""

from __future__ import annotations

import math
import numbers
from typing import Any


def finite(value: Any) -> float | None:
    """`value` as a float when it is a finite real number; None when it is absent, null, NaN, infinite, a bool (a
    flag is no measurement) or not a number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    as_float = float(value)
    return as_float if math.isfinite(as_float) else None
