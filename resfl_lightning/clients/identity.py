"""Which client a module evaluates as. A client's evaluation seeds its bootstrap SE and its noisy or k-means UFM
cohorts with (client id, round) (clients/base.py, detection.py, tabular.py). The live module keeps the id of the
client it trained last, which is another one on every rank, so the server's evaluations (the global model's test and
weather passes, resfl_robust's root split) evaluate as the server: client id -1 at the round, as the root update
trains (federation/root.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

SERVER = -1


@contextmanager
def as_server(model, round_idx: int) -> Iterator[None]:
    """`model` evaluates as the server at `round_idx` inside the block; its own (client id, round) afterwards. A model
    without them (a stand-in in a test) is left as it is."""
    if not (hasattr(model, "client_id") and hasattr(model, "round_idx")):
        yield
        return
    identity = model.client_id, model.round_idx
    model.client_id, model.round_idx = SERVER, round_idx
    try:
        yield
    finally:
        model.client_id, model.round_idx = identity


def cohort_seed(client_id: int, round_idx: int) -> int:
    """The seed of an evaluation's noisy or k-means UFM cohorts: client id + 1000 x round, as clients have always drawn
    it, taken modulo 2^32 so that the server's (-1 at round 0) is a valid seed too (4294967295: k-means and numpy
    refuse -1; every client's seed is unchanged)."""
    return (client_id + 1000 * round_idx) % 2**32
