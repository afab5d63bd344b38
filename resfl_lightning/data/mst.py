"""Monk Skin Tone (MST) scale: the ten published swatch colours and MST -> sensitive-group mapping.

Swatches: "Monk Skin Tone Scale by Dr. Ellis Monk, Google" (CC BY 4.0), MST 1 (lightest) .. MST 10 (darkest).
"""

from __future__ import annotations

import numpy as np

MST_HEX: tuple[str, ...] = (
    "#f6ede4",
    "#f3e7db",
    "#f7ead0",
    "#eadaba",
    "#d7bd96",
    "#a07e56",
    "#825c43",
    "#604134",
    "#3a312a",
    "#292420",
)
"""Swatch colour of MST 1..10 (index k-1 holds MST k), sRGB hex."""


def _hex_to_rgb(code: str) -> tuple[int, int, int]:
    code = code.lstrip("#")
    return int(code[0:2], 16), int(code[2:4], 16), int(code[4:6], 16)


MST_RGB: np.ndarray = np.array([_hex_to_rgb(h) for h in MST_HEX], dtype=np.uint8)
"""(10, 3) uint8 RGB swatches; row k-1 is MST k."""
MST_RGB.setflags(write=False)

GROUPINGS: tuple[str, ...] = ("mst10", "mst3")
# mst3 cut points: 1-3 light, 4-7 medium, 8-10 dark (index = MST value; entry 0 unused).
_MST3_OF_MST = np.array([-1, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2], dtype=np.int64)


def num_groups(grouping: str) -> int:
    """Number of sensitive groups G of a grouping ("mst10" -> 10, "mst3" -> 3)."""
    if grouping == "mst10":
        return 10
    if grouping == "mst3":
        return 3
    raise ValueError(f"unknown MST grouping {grouping!r}; expected one of {GROUPINGS}")


def mst_group_names(grouping: str) -> tuple[str, ...]:
    """The groups' names in index order: mst3 light, medium, dark (the cut points above); mst10 mst1 .. mst10."""
    if num_groups(grouping) == 3:
        return ("light", "medium", "dark")
    return tuple(f"mst{k}" for k in range(1, 11))


def mst_rgb(mst: int) -> tuple[int, int, int]:
    """RGB swatch of one MST value 1..10."""
    if not 1 <= int(mst) <= 10:
        raise ValueError(f"MST value must be in 1..10, got {mst}")
    return tuple(int(c) for c in MST_RGB[int(mst) - 1])  # type: ignore[return-value]


def group_of_mst(mst_values: np.ndarray | list[int] | int, grouping: str = "mst10") -> np.ndarray:
    """Map MST values 1..10 to 0-based group indices; -1 or NaN (unknown tone) maps to -1.

    "mst10": group = mst - 1.  "mst3": 1-3 -> 0 (light), 4-7 -> 1 (medium), 8-10 -> 2 (dark).
    """
    num_groups(grouping)  # validates the name
    values = np.asarray(mst_values)
    if values.dtype.kind == "f":
        unknown = np.isnan(values)
        filled = np.where(unknown, -1, values)
        if np.any(filled != np.round(filled)):
            bad = values[~unknown & (filled != np.round(filled))][0]
            raise ValueError(f"MST values must be whole numbers 1..10 (or -1/NaN for unknown), got {bad}")
        values = filled.astype(np.int64)
    elif values.dtype.kind in "iu":
        values = values.astype(np.int64)
    else:
        raise ValueError(f"MST values must be numeric, got dtype {values.dtype}")
    unknown = values == -1
    invalid = ~unknown & ((values < 1) | (values > 10))
    if np.any(invalid):
        raise ValueError(f"MST values must be in 1..10 (or -1 for unknown), got {values[invalid][0]}")
    safe = np.where(unknown, 1, values)
    groups = safe - 1 if grouping == "mst10" else _MST3_OF_MST[safe]
    return np.where(unknown, -1, groups).astype(np.int64)
