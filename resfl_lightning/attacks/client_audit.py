"""The server's per-client, per-round membership audit (attack.mia.per_client; docs/method.md §7): which client's
training data the global model leaks most, and after which round.

The target members of the reference attacks (lira / rmia) are drawn uniformly from the union of the clients'
training splits; each member belongs to exactly one client, so grouping the members by client and scoring each group
against the same held-back non-members gives every client's own AUC and low-FPR TPR, from the scores the global
metric already uses (nothing is drawn or trained again). Across the attack rounds (attack.every), the round whose
global AUC is highest is the round of peak leakage. Pure functions; the callback decides when.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from resfl_lightning.attacks.membership_scores import reference_metrics

MIN_CLIENT_MEMBERS = 2  # a client with fewer sampled members gets no AUC of its own


def member_clients(members: np.ndarray, client_train: Sequence[np.ndarray]) -> np.ndarray:
    """The client whose training split holds each member (a member in no split, or in two, is an error)."""
    members = np.asarray(members, np.int64)
    owner = np.full(members.shape, -1, np.int64)
    for k, train in enumerate(client_train):
        held = np.isin(members, np.asarray(train, np.int64))
        if (held & (owner >= 0)).any():
            raise ValueError(f"a target member is in the training splits of client {k} and another client")
        owner[held] = k
    if (owner < 0).any():
        raise ValueError(f"{int((owner < 0).sum())} target members are in no client's training split")
    return owner


def per_client_metrics(member_scores: np.ndarray, owners: np.ndarray, nonmember_scores: np.ndarray,
                       num_clients: int) -> dict[int, dict[str, float]]:
    """Client -> the reference metrics (AUC, TPR at 0.1 / 1 % FPR, counts) of its own members against every
    held-back non-member; clients with fewer than MIN_CLIENT_MEMBERS sampled members are left out."""
    member_scores, owners = np.asarray(member_scores, np.float64), np.asarray(owners, np.int64)
    if member_scores.shape != owners.shape:
        raise ValueError(f"member scores {member_scores.shape} and owners {owners.shape} differ")
    return {k: reference_metrics(member_scores[owners == k], nonmember_scores) for k in range(num_clients)
            if int((owners == k).sum()) >= MIN_CLIENT_MEMBERS}


def worst_client(clients: dict[int, dict[str, float]]) -> tuple[int, dict[str, float]] | None:
    """The client whose members leak most: highest TPR at 1 % FPR where the non-members resolve 1 % (at least 100 of
    them; with fewer, that TPR is the TPR at FPR 0 and ranks on a handful of examples), then highest AUC, then the
    lowest id."""
    if not clients:
        return None
    low_fpr = all(v["n_nonmembers"] >= 100 for v in clients.values())
    k = min(clients, key=lambda c: (-clients[c]["tpr_at_fpr_1"] if low_fpr else 0.0, -clients[c]["auc"], c))
    return k, clients[k]


def peak_round(auc_by_round: dict[int, float]) -> tuple[int, float] | None:
    """The attack round with the highest global AUC (the earliest on a tie); None without rounds."""
    finite = {r: a for r, a in auc_by_round.items() if np.isfinite(a)}
    if not finite:
        return None
    r = min(finite, key=lambda t: (-finite[t], t))
    return r, finite[r]
