"""Partial participation: which clients train in a round, and which rank trains each of them.

The sample is a function of (run seed, round) alone, so 1 process and N processes (and a resumed run) pick the same
clients. Sampled clients are dealt round-robin in sorted order, so ranks differ by at most one client per round; with
full participation that is the fixed rule client i -> rank i mod world size.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def sample_size(clients_per_round: int | float | None, num_clients: int) -> int:
    """How many clients a round samples: None = all, an int = a count, a float in (0, 1] = a fraction (>= 1)."""
    key = "federation.clients_per_round"
    if clients_per_round is None:
        return num_clients
    if isinstance(clients_per_round, bool) or not isinstance(clients_per_round, numbers.Real):
        raise ValueError(f"{key}: must be null, a count or a fraction in (0, 1], got {clients_per_round!r}")
    if isinstance(clients_per_round, numbers.Integral):
        if not 1 <= clients_per_round <= num_clients:
            raise ValueError(f"{key}: a count must lie in 1..{num_clients} (dataset.num_clients), "
                             f"got {clients_per_round}")
        return int(clients_per_round)
    frac = float(clients_per_round)
    if not (math.isfinite(frac) and 0 < frac <= 1):
        raise ValueError(f"{key}: a fraction must lie in (0, 1], got {clients_per_round}")
    return max(1, min(num_clients, int(math.floor(frac * num_clients + 0.5))))


def sample_clients(seed: int, round_idx: int, num_clients: int, clients_per_round: int | float | None) -> list[int]:
    """The round's participants, sorted; every client when the sample size is num_clients."""
    k = sample_size(clients_per_round, num_clients)
    if k == num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng(np.random.SeedSequence([seed, round_idx], spawn_key=(2,)))
    return sorted(int(i) for i in rng.choice(num_clients, size=k, replace=False))


def deal(clients: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's share of the sampled clients: every world_size-th in sorted order (may be empty)."""
    return sorted(clients)[rank::world_size]
