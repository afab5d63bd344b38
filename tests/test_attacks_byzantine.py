"""Byzantine sign flip, l2 bounding, attacker selection and BA AD."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resfl_lightning.attacks.byzantine import (
    byzantine_transform,
    choose_attackers,
    count_from_fraction,
    l2_bound,
    relative_drop,
    sign_flip,
)


def test_sign_flip_of_every_client_negates_weighted_sum():
    gen = torch.Generator().manual_seed(0)
    deltas = [torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(5)]
    weights = torch.softmax(torch.randn(5, generator=gen, dtype=torch.float64), 0)
    clean = sum(w * d for w, d in zip(weights, deltas, strict=True))
    flipped = sum(w * sign_flip(d, 1.0) for w, d in zip(weights, deltas, strict=True))
    torch.testing.assert_close(flipped, -clean)
    torch.testing.assert_close(sign_flip(deltas[0], 2.5), -2.5 * deltas[0])
    np.testing.assert_allclose(sign_flip(np.array([1.0, -2.0]), 3.0), [-3.0, 6.0])
    with pytest.raises(ValueError, match="gamma"):
        sign_flip(deltas[0], 0.0)


def test_sign_flip_on_state_dict_keeps_integer_buffers():
    sd = {"w": torch.tensor([1.0, -1.0]), "bn.num_batches_tracked": torch.tensor(3)}
    out = sign_flip(sd, 2.0)
    torch.testing.assert_close(out["w"], torch.tensor([-2.0, 2.0]))
    assert out["bn.num_batches_tracked"].item() == 3


def test_l2_bound_rescales_only_when_needed():
    gen = torch.Generator().manual_seed(1)
    d = 10 * torch.randn(100, generator=gen, dtype=torch.float64)
    bounded = l2_bound(d, 1.0)
    assert torch.linalg.vector_norm(bounded) == pytest.approx(1.0)
    # Same direction: a pure rescale, no noise added.
    torch.testing.assert_close(bounded, d / torch.linalg.vector_norm(d))
    small = 0.001 * d
    assert l2_bound(small, 1e6) is small  # already within the bound: unchanged
    # Mapping: joint norm over all floating entries.
    sd = {"a": torch.tensor([3.0]), "b": torch.tensor([4.0]), "n": torch.tensor(7)}
    out = l2_bound(sd, 1.0)
    torch.testing.assert_close(out["a"], torch.tensor([0.6]))
    torch.testing.assert_close(out["b"], torch.tensor([0.8]))
    assert out["n"].item() == 7
    with pytest.raises(ValueError, match="bound"):
        l2_bound(d, 0.0)


def test_byzantine_transform():
    d = torch.tensor([3.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(byzantine_transform(d, 2.0), torch.tensor([-6.0, -8.0], dtype=torch.float64))
    out = byzantine_transform(d, 2.0, l2_bound=5.0)
    torch.testing.assert_close(out, torch.tensor([-3.0, -4.0], dtype=torch.float64))
    assert torch.linalg.vector_norm(byzantine_transform(d, 10.0, l2_bound=2.0)) <= 2.0 + 1e-12


def test_attacker_selection():
    n, frac, seed = 10, 0.3, 42
    sets = [choose_attackers(n, frac, seed, r) for r in range(200)]
    assert all(len(s) == 3 and s == sorted(s) and len(set(s)) == 3 for s in sets)
    assert all(0 <= i < n for s in sets for i in s)
    assert choose_attackers(n, frac, seed, 7) == sets[7]  # reproducible from (seed, round)
    assert len({tuple(s) for s in sets}) > 50  # different across rounds
    assert sets != [choose_attackers(n, frac, seed + 1, r) for r in range(200)]
    counts = np.bincount([i for s in sets for i in s], minlength=n)
    assert (counts > 0).all()  # every client attacks sometimes
    assert sum(s == [0, 1, 2] for s in sets) < 10  # not always the first clients
    # Roughly uniform: each client is chosen in about 30% of rounds.
    assert np.all(np.abs(counts / 200 - frac) < 0.12)


def test_count_from_fraction():
    assert count_from_fraction(4, 0.25) == 1
    assert count_from_fraction(5, 0.5) == 3  # halves round up
    assert count_from_fraction(10, 0.35) == 4  # 3.4999999 in floating point still rounds to 4
    assert count_from_fraction(10, 0.0) == 0 and choose_attackers(10, 0.0, 0, 0) == []
    assert choose_attackers(4, 1.0, 0, 3) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="fraction"):
        count_from_fraction(4, 1.5)


def test_relative_drop():
    assert relative_drop(0.40, 0.30) == pytest.approx(0.25)
    assert relative_drop(0.40, 0.50) == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="clean metric is 0"):
        relative_drop(0.0, 0.1)
