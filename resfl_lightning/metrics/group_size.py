"""The minimum group size of the group metrics (`metrics.min_group_size`, docs/method.md §6): a group with fewer units
(rows; detection: ground-truth persons) on the evaluated split than the minimum is left out of every group metric of
that split. Leaving out = marking its units unknown (-1), which every group metric already skips, so one rule covers
them all; utility (accuracy, mAP) still counts every unit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["small_groups", "without_groups"]


def _ids(groups: Any) -> np.ndarray:
    return np.asarray(groups.detach().cpu() if isinstance(groups, torch.Tensor) else groups).reshape(-1)


def small_groups(groups: Any, min_group_size: int) -> dict[int, int]:
    """{group: its units} of the known groups present with fewer than min_group_size units (-1 = unknown, never
    counted); {} when min_group_size <= 1, which keeps every present group."""
    if min_group_size <= 1:
        return {}
    ids = _ids(groups).astype(np.int64)
    values, counts = np.unique(ids[ids >= 0], return_counts=True)
    return {int(g): int(n) for g, n in zip(values, counts, strict=True) if n < min_group_size}


def without_groups(groups: Any, excluded: Mapping[int, int] | set[int] | None) -> Any:
    """A copy of `groups` (tensor or array, same type and dtype) with the excluded groups' units set to -1; `groups`
    itself when nothing is excluded."""
    if not excluded:
        return groups
    ids = torch.as_tensor(sorted(excluded), dtype=torch.long)
    if isinstance(groups, torch.Tensor):
        return torch.where(torch.isin(groups, ids.to(groups.device)), torch.full_like(groups, -1), groups)
    arr = np.asarray(groups)
    return np.where(np.isin(arr, ids.numpy()), np.array(-1, dtype=arr.dtype), arr)
