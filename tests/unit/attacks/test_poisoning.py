"""Group-targeted poisoning: only target rows change, others bit-identical, counts right, seeded sets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resfl_lightning.attacks.poisoning import is_poison_round, poison_annotations, poisoned_clients


def _annotations(m: int = 60, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "image_index": np.sort(rng.integers(0, 15, size=m)).astype(np.int64),
        "cls": np.zeros((m, 1), dtype=np.float32),
        "boxes": rng.random((m, 4)).astype(np.float32),
        "groups": rng.integers(-1, 4, size=m).astype(np.int64),
        "box_id": np.arange(m, dtype=np.int64),  # extra per-box array carried along
    }


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray], rows_a: np.ndarray, rows_b: np.ndarray) -> None:
    for k in a:
        assert a[k][rows_a].tobytes() == b[k][rows_b].tobytes(), k


def test_drop_removes_only_target_rows():
    ann = _annotations()
    snapshot = {k: v.copy() for k, v in ann.items()}
    out, summary = poison_annotations(ann, target_group=2, mode="drop", rate=1.0, seed=0)
    target = ann["groups"] == 2
    assert summary["n_target_rows"] == int(target.sum()) == summary["n_poisoned"]
    assert summary["n_rows_after"] == len(ann["groups"]) - int(target.sum()) == len(out["groups"])
    assert summary["n_images_affected"] == len(np.unique(ann["image_index"][target]))
    assert not (out["groups"] == 2).any()
    _assert_same(out, ann, np.arange(len(out["groups"])), np.flatnonzero(~target))
    _assert_same(ann, snapshot, slice(None), slice(None))  # input untouched


def test_partial_rate_is_seeded_and_counted():
    ann = _annotations(200)
    n_target = int((ann["groups"] == 1).sum())
    out_a, sa = poison_annotations(ann, 1, "drop", rate=0.5, seed=3)
    out_b, sb = poison_annotations(ann, 1, "drop", rate=0.5, seed=3)
    _, sc = poison_annotations(ann, 1, "drop", rate=0.5, seed=4)
    assert sa["n_poisoned"] == int(np.floor(0.5 * n_target + 0.5))
    np.testing.assert_array_equal(sa["poisoned_rows"], sb["poisoned_rows"])
    assert not np.array_equal(sa["poisoned_rows"], sc["poisoned_rows"])
    assert (ann["groups"][sa["poisoned_rows"]] == 1).all()
    np.testing.assert_array_equal(out_a["box_id"], np.setdiff1d(ann["box_id"], sa["poisoned_rows"]))


def test_mislabel_changes_only_target_class():
    ann = _annotations()
    out, summary = poison_annotations(ann, target_group=0, mode="mislabel", rate=1.0, seed=0, mislabel_class=3)
    target = ann["groups"] == 0
    assert (out["cls"][target] == 3).all() and summary["n_poisoned"] == int(target.sum())
    assert out["cls"].dtype == ann["cls"].dtype and out["cls"].shape == ann["cls"].shape
    _assert_same(out, ann, ~target, ~target)
    for k in ("image_index", "boxes", "groups", "box_id"):  # only the class column of target rows moved
        assert out[k].tobytes() == ann[k].tobytes()
    with pytest.raises(ValueError, match="mislabel_class"):
        poison_annotations(ann, 0, "mislabel", 1.0, 0, mislabel_class=0)


def test_relabel_group_swaps_only_target_group():
    ann = {k: torch.from_numpy(v) for k, v in _annotations().items()}  # tensors are accepted too
    out, summary = poison_annotations(ann, target_group=3, mode="relabel_group", rate=1.0, seed=0, other_group=1)
    g = ann["groups"].numpy()
    target = g == 3
    assert (out["groups"][target] == 1).all() and not (out["groups"] == 3).any()
    _assert_same(out, {k: v.numpy() for k, v in ann.items()}, ~target, ~target)
    assert summary["n_poisoned"] == int(target.sum())
    with pytest.raises(ValueError, match="other_group"):
        poison_annotations(ann, 3, "relabel_group", 1.0, 0, other_group=3)


def test_bad_annotations_and_absent_group():
    ann = _annotations()
    bad = dict(ann, boxes=ann["boxes"][:-1])
    with pytest.raises(ValueError, match="'boxes'"):
        poison_annotations(bad, 1)
    with pytest.raises(ValueError, match="missing keys"):
        poison_annotations({"groups": ann["groups"]}, 1)
    out, summary = poison_annotations(ann, target_group=9, mode="drop")
    assert summary["n_poisoned"] == 0
    _assert_same(out, ann, slice(None), slice(None))


def test_poisoned_clients_and_rounds():
    a = poisoned_clients(10, 0.2, seed=5)
    assert a == poisoned_clients(10, 0.2, seed=5) and len(a) == 2 and a == sorted(a)
    chosen = {tuple(poisoned_clients(10, 0.2, seed=s)) for s in range(50)}
    assert len(chosen) > 10 and any(c != (0, 1) for c in chosen)
    assert [r for r in range(10) if is_poison_round(r, start=3, length=4)] == [3, 4, 5, 6]
    assert not any(is_poison_round(r, 3, 0) for r in range(10))
