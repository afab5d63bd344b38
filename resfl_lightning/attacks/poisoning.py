"""Group-targeted data poisoning (docs/method.md §7) on one client's annotation arrays.

Annotations are a mapping of per-box arrays with equal length M:
    "image_index" (M,) int, "cls" (M,) or (M, 1), "boxes" (M, 4), "groups" (M,) int (-1 = unknown),
plus optional extra per-box arrays (leading dimension M) that are carried along. Only rows of the target group change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from resfl_lightning.data.partition import count_from_fraction

REQUIRED_KEYS = ("image_index", "cls", "boxes", "groups")
MODES = ("drop", "mislabel", "relabel_group")
_ROW_STREAM = 0x504F49  # RNG stream tags keep these draws independent of other uses of the seed
_CLIENT_STREAM = 0x504F43


def _to_numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _validate(ann: Mapping[str, Any]) -> dict[str, np.ndarray]:
    missing = [k for k in REQUIRED_KEYS if k not in ann]
    if missing:
        raise ValueError(f"annotations: missing keys {missing} (have {sorted(ann)})")
    arrays = {k: _to_numpy(v) for k, v in ann.items()}
    m = arrays["groups"].reshape(-1).shape[0]
    for k, v in arrays.items():
        if v.ndim == 0 or v.shape[0] != m:
            raise ValueError(f"annotations[{k!r}]: leading dimension {v.shape[:1]} != {m} rows of 'groups'")
    if arrays["groups"].ndim != 1:
        raise ValueError(f"annotations['groups']: expected shape ({m},), got {arrays['groups'].shape}")
    if arrays["boxes"].ndim != 2 or arrays["boxes"].shape[1] != 4:
        raise ValueError(f"annotations['boxes']: expected shape ({m}, 4), got {arrays['boxes'].shape}")
    return arrays


def poison_annotations(
    ann: Mapping[str, Any],
    target_group: int,
    mode: str = "drop",
    rate: float = 1.0,
    seed: int = 0,
    other_group: int | None = None,
    mislabel_class: int | None = None,
    person_class: int = 0,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Poison round(rate * n) seeded-random rows of `target_group`; returns (new arrays, count summary).

    drop: remove those boxes (the persons become background); mislabel: set their class to `mislabel_class`
    (a non-person class id); relabel_group: set their group to `other_group`. The input is never modified; every
    other row is copied bit-identically.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    if target_group < 0:
        raise ValueError(f"target_group must be a known group (>= 0), got {target_group}")
    if mode == "mislabel" and (mislabel_class is None or mislabel_class == person_class or mislabel_class < 0):
        raise ValueError(f"mode 'mislabel' needs mislabel_class, a class id >= 0 other than {person_class} (person)")
    if mode == "relabel_group" and (other_group is None or other_group < 0 or other_group == target_group):
        raise ValueError(f"mode 'relabel_group' needs other_group >= 0 different from target_group {target_group}")
    arrays = _validate(ann)
    groups = arrays["groups"]
    n_rows = groups.shape[0]
    target_rows = np.flatnonzero(groups == target_group)
    n_poison = 0 if target_rows.size == 0 else count_from_fraction(target_rows.size, rate)
    rng = np.random.default_rng([seed, target_group, _ROW_STREAM])
    chosen = np.sort(rng.choice(target_rows, size=n_poison, replace=False)) if n_poison else target_rows[:0]

    out = {k: v.copy() for k, v in arrays.items()}
    if mode == "drop":
        keep = np.ones(n_rows, dtype=bool)
        keep[chosen] = False
        out = {k: v[keep] for k, v in out.items()}
    elif mode == "mislabel":
        out["cls"][chosen] = mislabel_class
    else:
        out["groups"][chosen] = other_group
    summary = {
        "mode": mode,
        "target_group": int(target_group),
        "n_rows_before": int(n_rows),
        "n_rows_after": int(out["groups"].shape[0]),
        "n_target_rows": int(target_rows.size),
        "n_poisoned": int(n_poison),
        "n_images_affected": int(np.unique(arrays["image_index"].reshape(-1)[chosen]).size),
        "poisoned_rows": chosen,
    }
    return out, summary


def poisoned_clients(num_clients: int, fraction: float, seed: int) -> list[int]:
    """Sorted ids of the round(fraction*N) poisoning clients: one fixed, seeded set for the whole run."""
    k = count_from_fraction(num_clients, fraction)
    rng = np.random.default_rng([seed, _CLIENT_STREAM])
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))


def is_poison_round(round_idx: int, start: int, length: int) -> bool:
    """True inside the poisoning block [start, start + length) (rounds or local epochs, whichever the caller counts)."""
    if start < 0 or length < 0:
        raise ValueError(f"start and length must be >= 0, got start={start}, length={length}")
    return start <= round_idx < start + length
