"""One home for client-local state (ARCHITECTURE "Client-local state").

A rank replays ONE live module for many clients, so whatever a client keeps between its rounds (the adversary phi,
the power-iteration vector, the UFM EMA, later control variates or personal layers) lives here, keyed by client id,
never on the module. The store is owned by the rank that trains the client; it keeps states in memory up to a byte
budget and always persists them under the run directory, so a checkpoint is consistent and resume restores them.

Crash consistency: each client's file keeps its last two versions, stamped with the round that wrote them. On resume
from a checkpoint of round r, the newest version written at or before r is used, so a crash between the client files
and the server checkpoint never leaks round r+1 state into a resumed round r+1.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import torch

ClientState = dict[str, torch.Tensor]


def state_bytes(state: ClientState) -> int:
    return sum(v.numel() * v.element_size() for v in state.values())


class ClientStateStore:
    """Per-client tensors: in memory up to `memory_budget_bytes` (LRU), always on disk after `commit`."""

    def __init__(self, directory: Path, memory_budget_bytes: int = 256 * 2**20):
        if memory_budget_bytes < 0:
            raise ValueError(f"federation.client_state_memory_mb must be >= 0, got {memory_budget_bytes}")
        self.directory = Path(directory)
        self.budget = memory_budget_bytes
        self._cache: OrderedDict[int, ClientState] = OrderedDict()
        self._bytes = 0  # state_bytes summed over _cache, kept as states come and go (not re-summed per put)
        self._dirty: dict[int, int] = {}  # client id -> round that wrote the unsaved state
        self._max_round: int | None = None  # resume: ignore versions written after this round
        self._ours: set[int] | None = None  # a fresh run: the clients whose file this run wrote (None: all files)

    # --- reading -------------------------------------------------------------------------------
    def path(self, client_id: int) -> Path:
        return self.directory / f"client_{client_id}.pt"

    def get(self, client_id: int) -> ClientState | None:
        """The client's latest state (a copy-free reference), or None before its first round."""
        if client_id in self._cache:
            self._cache.move_to_end(client_id)
            return self._cache[client_id]
        state = self._load(client_id)
        if state is not None:
            self._remember(client_id, state)
        return state

    def _load(self, client_id: int) -> ClientState | None:
        path = self.path(client_id)
        if not path.is_file() or (self._ours is not None and client_id not in self._ours):
            return None
        try:
            versions = torch.load(path, map_location="cpu", weights_only=True)["versions"]
        except Exception as err:  # noqa: BLE001 - re-raised with the file and client named
            raise RuntimeError(f"cannot read client {client_id}'s state {path}: {err}") from err
        usable = [v for v in versions if self._max_round is None or v["round"] <= self._max_round]
        return dict(max(usable, key=lambda v: v["round"])["state"]) if usable else None

    # --- writing -------------------------------------------------------------------------------
    def put(self, client_id: int, round_idx: int, state: ClientState) -> None:
        """Record the client's state after `round_idx`; written to disk by the next `commit`."""
        self._remember(client_id, {k: v.detach().to("cpu", copy=True) for k, v in state.items()})
        self._dirty[client_id] = round_idx

    def commit(self) -> None:
        """Persist every state changed since the last commit (called before the server checkpoint is written)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for client_id, round_idx in sorted(self._dirty.items()):
            state = self._cache.get(client_id)
            if state is None:  # evicted before commit: _evict writes dirty states itself
                continue
            self._write(client_id, round_idx, state)
        self._dirty.clear()
        self._max_round = None  # versions on disk are now all at or before the committed round

    def _write(self, client_id: int, round_idx: int, state: ClientState) -> None:
        path = self.path(client_id)
        previous = []
        if path.is_file() and (self._ours is None or client_id in self._ours):
            previous = [v for v in torch.load(path, map_location="cpu", weights_only=True)["versions"]
                        if v["round"] < round_idx]
        versions = sorted(previous, key=lambda v: v["round"])[-1:] + [{"round": round_idx, "state": state}]
        tmp = path.with_suffix(".tmp")
        torch.save({"client_id": client_id, "versions": versions}, tmp)
        os.replace(tmp, path)
        if self._ours is not None:
            self._ours.add(client_id)

    def _remember(self, client_id: int, state: ClientState) -> None:
        old = self._cache.get(client_id)
        self._bytes += state_bytes(state) - (0 if old is None else state_bytes(old))
        self._cache[client_id] = state
        self._cache.move_to_end(client_id)
        while len(self._cache) > 1 and self._bytes > self.budget:
            self._evict()

    def _evict(self) -> None:
        client_id, state = self._cache.popitem(last=False)
        self._bytes -= state_bytes(state)
        if client_id in self._dirty:  # spill: the state must survive leaving memory
            self.directory.mkdir(parents=True, exist_ok=True)
            self._write(client_id, self._dirty.pop(client_id), state)

    def memory_bytes(self) -> int:
        """Bytes of the states held in memory: O(1) per put, so a put costs the same with 10,000 states cached."""
        return self._bytes

    def start_fresh(self) -> None:
        """A run that does not resume: the files an earlier run left in the directory are not this run's states
        (read back, they made a second run into the same run_dir train other bits than the first)."""
        self._ours = set()

    def restore_to(self, round_idx: int) -> None:
        """Resume after round `round_idx`: forget memory, read only versions written at or before it."""
        self._cache.clear()
        self._bytes = 0
        self._dirty.clear()
        self._max_round = round_idx
        self._ours = None

    def __len__(self) -> int:
        return len(self._cache)
