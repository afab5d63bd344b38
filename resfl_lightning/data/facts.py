"""What a federation will see, from its built data alone (no model): items per split and client (rows, or images and
persons for detection), group sizes per split, the positive rate per group (classification), and the groups too
small in the test split to measure well. `resfl data` prints these (resfl_lightning/cli/data.py); everything here
is plain numbers, so the same facts go out as JSON.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# A display hint, not a rule: with fewer test rows (persons) than this, a group's rates and gaps are too noisy to
# read much into (a 95% interval of a rate near 0.5 is wider than +-0.18).
SMALL_GROUP_TEST_ITEMS = 30


def _as_numpy(values: Any) -> np.ndarray:
    return np.asarray(values.cpu() if hasattr(values, "cpu") else values)


def _objects(data: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """(item of each object, group of each object, label of each object or None, number of items): tabular data
    has one object (row) per item, with a label; detection data has persons inside images."""
    if hasattr(data, "source") and hasattr(data.source, "annotations"):
        ann = data.source.annotations
        return np.asarray(ann.image_index, np.int64), np.asarray(ann.groups, np.int64), None, len(data.source)
    groups = _as_numpy(data.groups).astype(np.int64)
    return np.arange(len(groups)), groups, _as_numpy(data.y).astype(np.int64), len(groups)


def _per_split(split_of_object: np.ndarray, num_splits: int, num_groups: int, groups: np.ndarray,
               keep: np.ndarray) -> np.ndarray:
    """(num_splits, num_groups) counts of the kept objects with a known group."""
    sel = keep & (split_of_object >= 0) & (groups >= 0)
    flat = split_of_object[sel] * num_groups + groups[sel]
    return np.bincount(flat, minlength=num_splits * num_groups).reshape(num_splits, num_groups)


def _entry(split: str, client: str | None, items: int, counts: np.ndarray, unknown: int, persons: int | None,
           positives: np.ndarray | None, names: list[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"split": split, "client": client, "items": int(items), "persons": persons,
                           "groups": {n: int(c) for n, c in zip(names, counts, strict=True)},
                           "unknown_group": int(unknown)}
    if positives is not None:
        row["positive_rate"] = {n: (float(p / c) if c else None)
                                for n, p, c in zip(names, positives, counts, strict=True)}
        total = int(counts.sum())
        row["positive_rate_all"] = float(positives.sum() / total) if total else None
    return row


def data_facts(data: Any, group_names: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The facts of federated data (FederatedTabularData / FederatedDetectionData): one entry per client's train and
    validation split, then the train and validation totals, the test split and the attack reserve, each with its
    item count, persons (detection), objects per group and positive rate per group (classification); then the
    groups with fewer than SMALL_GROUP_TEST_ITEMS objects in the test split."""
    owner, groups, labels, num_items = _objects(data)
    names = list(group_names)
    if len(names) != data.num_groups:
        raise ValueError(f"{len(names)} group names for {data.num_groups} groups")
    splits = data.splits
    parts = [a for c in splits.clients for a in (c.train, c.val)] + [splits.test, splits.reserve]
    # The splits are disjoint (FederatedSplits checks it): one split id per item, one pass over the objects.
    split_of_item = np.full(max([num_items] + [int(np.max(p)) + 1 for p in parts if len(p)]), -1, np.int64)
    for sid, items in enumerate(parts):
        split_of_item[np.asarray(items, np.int64)] = sid
    where = split_of_item[owner]
    every = np.ones(len(owner), bool)
    counts = _per_split(where, len(parts), len(names), groups, every)
    unknown = np.bincount(where[(where >= 0) & (groups < 0)], minlength=len(parts))
    positives = None if labels is None else _per_split(where, len(parts), len(names), groups, labels == 1)
    detection = labels is None
    k = len(splits.clients)
    # rows: the clients' train / val splits, then the train and val totals, test and reserve
    sizes = np.array([len(p) for p in parts])
    blocks = [(2 * i + j,) for i in range(k) for j in (0, 1)] + [tuple(range(0, 2 * k, 2)),
                                                                  tuple(range(1, 2 * k, 2)), (2 * k,), (2 * k + 1,)]
    clients = list(splits.client_names) or [str(i) for i in range(k)]
    labels_of = [("train" if j == 0 else "val", clients[i]) for i in range(k) for j in (0, 1)] + \
        [("train", None), ("val", None), ("test", None), ("reserve", None)]
    rows = []
    for (split, client), ids in zip(labels_of, blocks, strict=True):
        ids = list(ids)
        c = counts[ids].sum(axis=0)
        persons = int(c.sum() + unknown[ids].sum()) if detection else None
        rows.append(_entry(split, client, int(sizes[ids].sum()), c, int(unknown[ids].sum()), persons,
                           None if positives is None else positives[ids].sum(axis=0), names))
    test = rows[-2]["groups"]
    return {"task": data.task, "unit": "images" if detection else "rows", "group_names": names,
            "num_clients": k, "partition": splits.partition, "h_tv": float(splits.h_tv), "splits": rows,
            "small_group_threshold": SMALL_GROUP_TEST_ITEMS,
            "small_groups": {n: c for n, c in test.items() if c < SMALL_GROUP_TEST_ITEMS}}
