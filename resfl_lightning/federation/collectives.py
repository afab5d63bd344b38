"""No hang on a dead process: guarded collectives, a progress beacon, and a watcher over locally launched ranks.

Two ways a dead rank is noticed, whichever comes first:
- the surviving ranks' next collective fails (gloo/NCCL see the closed connection) or times out after
  `fabric.timeout_s`; `Collectives` turns that into a `PeerFailure` naming the rank that fell behind and the round;
- on the launching process of a node (Fabric's subprocess launcher), `PeerWatch` sees a child exit and stops the
  node at once with the same kind of message (it replaces Lightning's observer, which SIGKILLs without a word).
The checkpoint of the last completed round is intact either way (it and the client states are written atomically),
so `resume=true` continues the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist
from lightning.fabric.strategies import DDPStrategy
from lightning.fabric.strategies.launchers.subprocess_script import (
    _set_num_threads_if_needed,
    _SubprocessScriptLauncher,
)

BEACON = "resfl/at/{rank}"


class PeerFailure(RuntimeError):
    """A collective failed or timed out because another rank died or hangs."""


@dataclass
class Progress:
    """Where this process is (read by PeerWatch from its thread)."""

    round_idx: int = -1
    step: str = "start"
    saved_round: int = -1  # last round whose checkpoint exists
    checkpoint: str = ""


PROGRESS = Progress()


def resume_hint() -> str:
    if PROGRESS.saved_round < 0:
        return "No round had completed, so there is no checkpoint to resume from"
    return (f"The checkpoint of the last completed round ({PROGRESS.saved_round}) is intact at {PROGRESS.checkpoint}; "
            "rerun the same command with resume=true to continue")


class Collectives:
    """The orchestrator's collectives, each announced on the rendezvous store before it starts."""

    def __init__(self, fabric):
        self.fabric = fabric
        self.rank, self.world = fabric.global_rank, fabric.world_size
        self._store = None
        if self.world > 1 and dist.is_initialized():
            self._store = dist.distributed_c10d._get_default_store()  # the TCPStore Fabric rendezvoused on

    def at(self, round_idx: int, step: str) -> None:
        """Record where this process is (no communication)."""
        PROGRESS.round_idx, PROGRESS.step = round_idx, step

    def _announce(self, round_idx: int, step: str) -> None:
        self.at(round_idx, step)
        if self._store is not None:
            try:
                self._store.set(BEACON.format(rank=self.rank), f"{round_idx}:{step}")
            except Exception as err:  # noqa: BLE001 - the store lives on rank 0
                raise PeerFailure(self._message(round_idx, step, err)) from err

    def _positions(self) -> dict[int, str] | None:
        """Last announced (round:step) of every rank, or None when the store (on rank 0) is unreachable."""
        try:
            self._store.set_timeout(timedelta(seconds=5))
            out = {}
            for r in range(self.world):
                key = BEACON.format(rank=r)
                out[r] = self._store.get(key).decode() if self._store.check([key]) else "-1:start"
            return out
        except Exception:  # noqa: BLE001 - an unreachable store is itself the diagnosis
            return None

    def _message(self, round_idx: int, step: str, err: BaseException) -> str:
        head = f"rank {self.rank}: {step} in round {round_idx} failed"
        positions = self._positions() if self._store is not None else {}
        if not positions and self._store is None:
            why = "another rank died or hangs"
        elif positions is None:
            why = "rank 0 (which hosts the rendezvous store) is unreachable: rank 0 died"
        else:
            behind = [r for r, at in positions.items() if at != f"{round_idx}:{step}"]
            where = ", ".join(f"rank {r} last reached round {at.replace(':', ' (', 1)})" for r, at in
                              sorted(positions.items()) if r in behind)
            why = (f"rank {', '.join(map(str, behind))} did not reach it ({where}): that process died or hangs"
                   if behind else "every rank reached it; a peer died inside the collective")
        return f"{head}: {why}. {resume_hint()}. ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"

    @contextmanager
    def guard(self, round_idx: int, step: str):
        self._announce(round_idx, step)
        if self.world == 1:
            yield
            return
        try:
            yield
        except PeerFailure:
            raise
        except (RuntimeError, dist.DistError) as err:
            if ACTIVE_WATCH is not None:  # the launcher: a dead child's exit code says more than gloo's error
                ACTIVE_WATCH.check_now(wait_s=2.0)
            raise PeerFailure(self._message(round_idx, step, err)) from err

    def gather(self, obj, round_idx: int, step: str = "report all_gather") -> list:
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        with self.guard(round_idx, step):
            dist.all_gather_object(out, obj)
        return out

    def all_reduce_sum(self, t, round_idx: int, step: str = "update all_reduce"):
        if self.world == 1:
            return t
        with self.guard(round_idx, step):
            return self.fabric.all_reduce(t, reduce_op="sum")

    def barrier(self, round_idx: int, step: str) -> None:
        if self.world == 1:
            return
        with self.guard(round_idx, step):
            self.fabric.barrier()


class PeerWatch(threading.Thread):
    """On the launching process: when a child rank exits with an error, say which and when, then stop the node."""

    def __init__(self, procs: list[subprocess.Popen], first_rank: int, period_s: float = 0.5, exit_fn=os._exit):
        super().__init__(daemon=True, name="resfl-peer-watch")
        self.procs, self.first_rank, self.period_s, self.exit_fn = procs, first_rank, period_s, exit_fn
        self._lock = threading.Lock()

    def run(self) -> None:
        while True:
            time.sleep(self.period_s)
            if all(p.poll() == 0 for p in self.procs):
                return
            self._stop_if_a_child_died()

    def check_now(self, wait_s: float) -> None:
        """Called by a failed collective on this process: gloo often notices a dead peer before the next poll, so
        wait up to wait_s for a child's exit code and report it the same way; returns when every child still runs."""
        deadline = time.monotonic() + wait_s
        while True:
            self._stop_if_a_child_died()
            if time.monotonic() >= deadline:
                return
            time.sleep(0.05)

    def _stop_if_a_child_died(self) -> None:
        with self._lock:
            dead = [(i, c) for i, c in enumerate(p.poll() for p in self.procs) if c not in (None, 0)]
            if not dead:
                return
            i, code = dead[0]
            rank = self.first_rank + i + 1
            sys.stderr.write(f"\nrank {rank} (pid {self.procs[i].pid}) exited with code {code} during round "
                             f"{PROGRESS.round_idx} ({PROGRESS.step} on rank {self.first_rank}); stopping every "
                             f"rank. {resume_hint()}.\n")
            sys.stderr.flush()
            for p in self.procs:  # peers may sit in a collective that never completes
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
            self.exit_fn(1)


# The launching process's PeerWatch (None elsewhere), so a failed collective there can ask it first.
ACTIVE_WATCH: PeerWatch | None = None


class WatchedLauncher(_SubprocessScriptLauncher):
    """Fabric's subprocess launcher with PeerWatch in place of Lightning's silent SIGKILL observer."""

    def launch(self, function, *args, **kwargs):
        self.cluster_environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
            global ACTIVE_WATCH
            ACTIVE_WATCH = PeerWatch(self.procs, first_rank=self.cluster_environment.node_rank() * self.num_processes)
            ACTIVE_WATCH.start()
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)


class WatchedDDPStrategy(DDPStrategy):
    """DDP process group set-up only (clients are never wrapped): a collective timeout and PeerWatch."""

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if self._start_method == "popen":
            self._launcher = WatchedLauncher(self.cluster_environment, self.num_processes, self.num_nodes)


def build_strategy(strategy: str, world: int, timeout_s: float):
    """'ddp' / 'ddp_spawn' with the collective timeout; anything else (auto on one process) passes through."""
    if world <= 1 or strategy not in ("ddp", "ddp_spawn"):
        return strategy
    return WatchedDDPStrategy(timeout=timedelta(seconds=float(timeout_s)),
                              start_method="spawn" if strategy == "ddp_spawn" else "popen")
