"""The launching process names a dead child rank even when gloo reports the broken connection first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from resfl_lightning.federation import collectives
from resfl_lightning.federation.collectives import Collectives, PeerFailure, PeerWatch


class Child:
    def __init__(self, code, pid=4242):
        self.code, self.pid, self.signals = code, pid, []

    def poll(self):
        return self.code

    def send_signal(self, sig):
        self.signals.append(sig)


def raising_exit(code):
    raise SystemExit(code)


def test_a_failed_collective_on_the_launcher_reports_the_dead_child(monkeypatch, capsys):
    """Before the fix the launcher raised gloo's 'Connection closed by peer' as a PeerFailure and exited before the
    watcher's next poll, so the child's exit code was never printed."""
    dead, alive = Child(-9), Child(None, pid=4343)
    monkeypatch.setattr(collectives, "ACTIVE_WATCH", PeerWatch([dead, alive], first_rank=0, exit_fn=raising_exit))
    comm = Collectives(SimpleNamespace(global_rank=0, world_size=3))
    with pytest.raises(SystemExit) as stop, comm.guard(1, "report all_gather"):
        raise RuntimeError("Connection closed by peer")
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert "rank 1 (pid 4242) exited with code -9 during round 1 (report all_gather on rank 0)" in err
    assert alive.signals and not dead.signals  # the surviving peer is stopped, not left in a collective


def test_with_every_child_running_the_collective_failure_is_raised(monkeypatch):
    monkeypatch.setattr(collectives, "ACTIVE_WATCH", PeerWatch([Child(None)], first_rank=0, exit_fn=raising_exit))
    comm = Collectives(SimpleNamespace(global_rank=0, world_size=2))
    with pytest.raises(PeerFailure, match="rank 0: report all_gather in round 2 failed"), \
            comm.guard(2, "report all_gather"):
        raise RuntimeError("Connection closed by peer")
