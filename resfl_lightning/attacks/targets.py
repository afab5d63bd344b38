"""What the attacker trains and scores on: reserve splits, member samples, the shadow model, RNG isolation."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from resfl_lightning.attacks.settings import MiaSettings
from resfl_lightning.attacks.update_features import dominant_group
from resfl_lightning.data.federated import base_data
from resfl_lightning.data.partition import stratified_split

_SHADOW_STREAM = 0x534844  # RNG stream tags: attack randomness never reuses a training stream
_MEMBER_STREAM = 0x4D454D
_RESERVE_STREAM = 0x525356


# --- reproducible randomness ---------------------------------------------------------------------------------
def stream_seed(seed: int, *tags: int) -> int:
    """A 32-bit seed for one attack stage, independent of every training stream of the same run seed."""
    return int(np.random.SeedSequence([int(seed), *[int(t) for t in tags]]).generate_state(1)[0])


@contextlib.contextmanager
def isolated_rng(device: torch.device | None = None) -> Iterator[None]:
    """Run attack code without touching the run's torch / numpy / python RNG state (restored on exit)."""
    np_state, py_state = np.random.get_state(), random.getstate()
    devices = [device] if device is not None and device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


# --- data helpers ------------------------------------------------------------------------------------------------
def minority_group(data: Any, min_test_size: int = 1) -> int:
    """The known group with the fewest items (ties: the lowest id): the protected group of a dataset that declares
    none (docs/method.md §7). min_test_size > 1 (metrics.min_group_size): among the groups with at least that many
    objects in the test split, which the group metrics measure (all groups when none has)."""
    groups = item_groups(data)
    num_groups = base_data(data).num_groups
    counts = np.bincount(groups[groups >= 0], minlength=num_groups)
    present = np.flatnonzero(counts > 0)
    if present.size == 0:
        raise ValueError("no item has a known group: the protected group cannot be chosen")
    if min_test_size > 1:
        tested = object_groups(data, base_data(data).splits.test)
        measured = np.bincount(tested[tested >= 0], minlength=num_groups) >= min_test_size
        present = present[measured[present]] if measured[present].any() else present
    return int(present[np.argmin(counts[present])])


def item_groups(data: Any) -> np.ndarray:
    """One group per item (image: its most frequent known person group, -1 if none), for stratified splits."""
    data = base_data(data)
    if hasattr(data, "item_groups"):
        return np.asarray(data.item_groups(), dtype=np.int64)
    if hasattr(data, "source") and hasattr(data.source, "annotations"):
        from resfl_lightning.data.partition import image_groups

        ann = data.source.annotations
        return image_groups(ann.image_index, ann.groups, len(data.source))
    if hasattr(data, "groups"):  # one row per item (tabular)
        return np.asarray(data.groups.cpu() if hasattr(data.groups, "cpu") else data.groups, dtype=np.int64)
    raise NotImplementedError(f"{type(data).__name__}: provide item_groups() for the attack reserve split")


def object_groups(data: Any, items: np.ndarray) -> np.ndarray:
    """Sensitive groups of every labelled object (person / row) in the given items (distinct item indices)."""
    data = base_data(data)
    items = np.asarray(items, np.int64)
    if hasattr(data, "source") and hasattr(data.source, "annotations"):
        ann = data.source.annotations
        return ann.groups[np.isin(ann.image_index, items)]
    if hasattr(data, "groups"):
        return item_groups(data)[items]
    raise NotImplementedError(f"{type(data).__name__}: no per-object groups for the update-aware AIA")


def client_train_groups(data: Any, client_id: int) -> np.ndarray:
    """Sensitive groups of every labelled object in a client's *clean* training split (evaluation ground truth)."""
    data = base_data(data)
    if hasattr(data, "train_groups"):
        return np.asarray(data.train_groups(client_id), dtype=np.int64)
    return object_groups(data, data.splits.clients[client_id].train)


def client_dominant_group(data: Any, client_id: int) -> int:
    return dominant_group(client_train_groups(data, client_id), base_data(data).num_groups)


def items_dominant_group(data: Any, items: np.ndarray) -> int:
    """Dominant group of the objects in a set of items (a shadow client's training set)."""
    return dominant_group(object_groups(data, items), base_data(data).num_groups)


def train_loader_for(data: Any, indices: np.ndarray, seed: int):
    """A shuffled, augmented training loader over arbitrary items (the shadow model's training set)."""
    return base_data(data).train_loader_for(indices, seed=seed)


@dataclass(frozen=True)
class ReserveSplit:
    """The attack reserve cut three ways for the MIA (indices into the dataset)."""

    shadow_members: np.ndarray
    shadow_nonmembers: np.ndarray
    target_nonmembers: np.ndarray


def split_reserve(reserve: np.ndarray, groups: np.ndarray, settings: MiaSettings, seed: int) -> ReserveSplit:
    """Stratified (by item group) three-way split of the reserve; reproducible from the run seed."""
    reserve = np.asarray(reserve, np.int64)
    n = len(reserve)
    m = settings
    rng = np.random.default_rng(stream_seed(seed, _RESERVE_STREAM))
    rest, members = stratified_split(reserve, groups, m.shadow_member_fraction, rng)
    frac = m.shadow_nonmember_fraction * n / len(rest) if len(rest) else 0.0
    target, nonmembers = stratified_split(rest, groups, min(frac, 0.999), rng)
    return ReserveSplit(members, nonmembers, target)


def sample_members(data: Any, count: int, seed: int) -> np.ndarray:
    """`count` items drawn uniformly (seeded) from the union of every client's training split: target members."""
    splits = base_data(data).splits
    pool = np.sort(np.concatenate([c.train for c in splits.clients]))
    if count > len(pool):
        raise ValueError(f"need {count} member items but the clients hold {len(pool)} training items")
    rng = np.random.default_rng(stream_seed(seed, _MEMBER_STREAM))
    return np.sort(rng.choice(pool, size=count, replace=False))


# --- the shadow model --------------------------------------------------------------------------------------------
class ShadowModel:
    """One shadow client trained with the target's recipe (same client class, losses, optimiser, local epochs per
    round and lr schedule) on the reserve's shadow members, advanced round by round so that after `advance(r)` it
    has had exactly the r rounds of local epochs the target's data has had. It sees no aggregation: it is one client.
    """

    def __init__(self, federation: Any, indices: np.ndarray, seed: int):
        self.federation, self.indices, self.seed = federation, np.asarray(indices, np.int64), seed
        self.client = None
        self.rounds_done = 0

    def advance(self, rounds: int) -> Any:
        from resfl_lightning.federation.local import local_train

        fed = self.federation
        fabric, s = fed.fabric, fed.settings
        with isolated_rng(fabric.device):
            if self.client is None:
                torch.manual_seed(stream_seed(self.seed, _SHADOW_STREAM))
                self.client = fabric.to_device(fed.client_factory())
            for r in range(self.rounds_done, rounds):
                rseed = stream_seed(self.seed, _SHADOW_STREAM, r + 1)
                torch.manual_seed(rseed)
                self.client.begin_client(-1, r)
                local_train(fabric, self.client, lambda epoch, rs=rseed: train_loader_for(fed.data, self.indices,
                                                                                           rs + epoch),
                            s.local_epochs, lr_factor=s.lr_factor(r), name=f"shadow model, round {r}")
                self.rounds_done = r + 1
        return self.client
