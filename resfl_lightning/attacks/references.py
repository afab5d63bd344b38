"""The reference models of the LiRA / RMIA membership attacks (docs/method.md §7): K clients trained with the run's
recipe on complementary random halves of a reference pool from the attack reserve, so every pool item is in the
training set of exactly half of them; and the rule that picks, per example, the references that never saw it."""

from __future__ import annotations

from typing import Any

import numpy as np

from resfl_lightning.attacks.targets import ShadowModel, stream_seed

_REFERENCE_STREAM = 0x524546  # the pool halves and each reference's training: never a training or shadow stream


def complementary_halves(pool: np.ndarray, count: int, seed: int) -> list[np.ndarray]:
    """`count` (even) training sets: per pair, a seeded random half of the pool and the other half."""
    if count < 2 or count % 2:
        raise ValueError(f"references: need an even count >= 2, got {count}")
    rng = np.random.default_rng(stream_seed(seed, _REFERENCE_STREAM))
    halves = []
    for _ in range(count // 2):
        perm = rng.permutation(np.asarray(pool, np.int64))
        halves += [np.sort(perm[: len(perm) // 2]), np.sort(perm[len(perm) // 2:])]
    return halves


class ReferenceModels:
    """K reference clients, each a ShadowModel (the run's recipe, one client, no aggregation) on its own half of the
    pool with its own seed, advanced round by round like the shadow."""

    def __init__(self, federation: Any, pool: np.ndarray, count: int, seed: int):
        self.pool = np.sort(np.asarray(pool, np.int64))
        self.trained_on = complementary_halves(self.pool, count, seed)
        self.models = [ShadowModel(federation, items, stream_seed(seed, _REFERENCE_STREAM, k + 1))
                       for k, items in enumerate(self.trained_on)]

    def advance(self, rounds: int) -> list[Any]:
        return [m.advance(rounds) for m in self.models]

    @property
    def rounds_done(self) -> int:
        return min(m.rounds_done for m in self.models)

    def trained_mask(self, items: np.ndarray) -> np.ndarray:
        """(K, n) bool: reference k trained on item i."""
        return np.stack([np.isin(np.asarray(items, np.int64), t) for t in self.trained_on])


def out_references(confidences: np.ndarray, trained: np.ndarray) -> np.ndarray:
    """Per example, the confidences of the references that did not train on it, as (K_out, n). Complementary halves
    make K_out the same for every example of one kind: K for examples outside the pool, K / 2 for pool items."""
    conf, out = np.asarray(confidences, np.float64), ~np.asarray(trained, bool)
    if conf.shape != out.shape:
        raise ValueError(f"confidences {conf.shape} and the training mask {out.shape} differ")
    counts = out.sum(axis=0)
    if counts.size and (counts.min() == 0 or counts.min() != counts.max()):
        raise ValueError(f"every example needs the same number (> 0) of OUT references, got {np.unique(counts)}")
    k_out = int(counts[0]) if counts.size else conf.shape[0]
    return conf.T[out.T].reshape(conf.shape[1], k_out).T
