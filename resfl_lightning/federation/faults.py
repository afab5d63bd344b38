"""Client failures: what makes a client's round unusable, and a hook that injects each kind (debug.fail_clients).

A client whose local training raises, whose loss or update is non-finite, or whose report (or, for FairFed, whose
pre-round group statistics) is malformed is left out of the round's aggregation (the orchestrator catches
`Exception` around the client and warns with a `ClientDroppedWarning` naming client and round); the run goes on.
"""

from __future__ import annotations

import math
import numbers
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from resfl_lightning.types import ClientReport
from resfl_lightning.values import finite

FAULTS = ("raise", "nan_loss", "nan_update", "bad_report", "bad_stats")


class ClientDroppedWarning(UserWarning):
    """A client was left out of a round's aggregation."""


class ClientFault(RuntimeError):
    """A client's round produced something the server must not aggregate."""


class InjectedFault(RuntimeError):
    """Raised by debug.fail_clients=<client>:<round>:raise."""


def warn_dropped(client_id: int, round_idx: int, reason: str) -> None:
    warnings.warn(f"client {client_id}, round {round_idx}: dropped from aggregation: {reason}",
                  ClientDroppedWarning, stacklevel=2)


def check_update(report, delta: torch.Tensor, score: float | None, client_id: int, round_idx: int,
                 validated: bool = True) -> None:
    """Raise ClientFault (naming client, round and field) unless the report and update can be aggregated.

    NaN is allowed where it means "not measured": ufm_raw (fewer than two groups), ufm_ema (EMA off or not yet
    set) and fim_eigenvalue (not requested); a streaming rule's score must be finite or -inf (weight 0); a gather-all
    rule has no per-client score (None). Without validation (federation.client_validation=when_used) the evaluation
    fields are NaN and not checked."""
    where = f"client {client_id}, round {round_idx}"
    if not isinstance(report, ClientReport):
        raise ClientFault(f"{where}: report is a {type(report).__name__}, not a ClientReport")
    if report.client_id != client_id:
        raise ClientFault(f"{where}: report names client {report.client_id}")
    if isinstance(report.num_samples, bool) or not isinstance(report.num_samples, numbers.Integral) \
            or report.num_samples <= 0:
        raise ClientFault(f"{where}: report field num_samples={report.num_samples!r} is not a positive count")
    for key in ("u", "val_utility", "val_utility50", "eval_loss") if validated else ():
        if finite(getattr(report, key)) is None:
            raise ClientFault(f"{where}: report field {key}={getattr(report, key)!r} is not a finite number")
    bad = [k for k, v in report.train_losses.items() if finite(v) is None]
    if bad:
        raise ClientFault(f"{where}: non-finite training loss {bad[0]}={report.train_losses[bad[0]]!r}")
    # -inf is a weight of exactly 0 (FairFed), not a fault
    if score is not None and not (finite(score) is not None or score == -math.inf):
        raise ClientFault(f"{where}: aggregation score {score!r} is not finite")
    if not torch.isfinite(delta).all():
        raise ClientFault(f"{where}: update has {int((~torch.isfinite(delta)).sum())} non-finite values")


def check_group_stats(stats, num_groups: int, client_id: int, round_idx: int) -> None:
    """Raise ClientFault unless `stats` = (TP, positives, (correct, total)): two length-`num_groups` vectors of
    finite counts with 0 <= TP <= positives and 0 <= correct <= total (what FairFed's server weights come from)."""
    where = f"client {client_id}, round {round_idx}: group statistics"
    if not isinstance(stats, tuple) or len(stats) != 3:
        raise ClientFault(f"{where} are a {type(stats).__name__}, not a (TP, positives, (correct, total)) triple")
    tp, pos, acc = (torch.as_tensor(x, dtype=torch.float64) for x in stats)
    if tp.shape != (num_groups,) or pos.shape != (num_groups,) or acc.shape != (2,):
        raise ClientFault(f"{where} have shapes {tuple(tp.shape)} / {tuple(pos.shape)} / {tuple(acc.shape)}, "
                          f"expected ({num_groups},) / ({num_groups},) / (2,)")
    if not (torch.isfinite(tp).all() and torch.isfinite(pos).all() and torch.isfinite(acc).all()):
        raise ClientFault(f"{where} are not finite (TP {tp.tolist()}, positives {pos.tolist()}, "
                          f"correct/total {acc.tolist()})")
    if (tp < 0).any() or (tp > pos).any() or not 0 <= acc[0] <= acc[1]:
        raise ClientFault(f"{where} are not counts with 0 <= TP <= positives and 0 <= correct <= total (TP "
                          f"{tp.tolist()}, positives {pos.tolist()}, correct/total {acc.tolist()})")


@dataclass(frozen=True)
class FaultPlan:
    """debug.fail_clients entries "<client>:<round>:<fault>" (round "*" = every round); faults in FAULTS."""

    entries: dict[tuple[int, int | None], str] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs) -> FaultPlan:
        entries: dict[tuple[int, int | None], str] = {}
        for spec in specs or ():
            parts = str(spec).split(":")
            ok = len(parts) == 3 and parts[0].strip().isdigit() and (parts[1].strip() == "*"
                                                                     or parts[1].strip().isdigit())
            if not ok or parts[2].strip() not in FAULTS:
                raise ValueError(f"debug.fail_clients: entry {spec!r} is not '<client>:<round or *>:<fault>' "
                                 f"with fault one of {', '.join(FAULTS)}")
            rnd = None if parts[1].strip() == "*" else int(parts[1])
            entries[(int(parts[0]), rnd)] = parts[2].strip()
        return cls(entries)

    def fault(self, client_id: int, round_idx: int) -> str | None:
        for key in ((client_id, round_idx), (client_id, None)):  # this round's fault first, then an every-round one
            if key in self.entries:
                return self.entries[key]
        return None

    def before_training(self, client_id: int, round_idx: int) -> None:
        if self.fault(client_id, round_idx) == "raise":
            raise InjectedFault(f"client {client_id}, round {round_idx}: injected failure (debug.fail_clients)")

    @contextmanager
    def during_training(self, client, client_id: int, round_idx: int):
        """nan_loss: every training step's loss is multiplied by NaN (the local loop must catch it)."""
        if self.fault(client_id, round_idx) != "nan_loss":
            yield
            return
        step = client.training_step
        client.training_step = lambda *a, **k: step(*a, **k) * float("nan")
        try:
            yield
        finally:
            del client.training_step  # back to the class's method

    def group_stats(self, client_id: int, round_idx: int, stats: tuple) -> tuple:
        """bad_stats: the client's pre-round group statistics (FairFed) come back as NaN."""
        if self.fault(client_id, round_idx) != "bad_stats":
            return stats
        return tuple(torch.full_like(torch.as_tensor(x, dtype=torch.float64), float("nan")).numpy() for x in stats)

    def after_training(self, client_id: int, round_idx: int, report: ClientReport,
                       delta: torch.Tensor) -> tuple[ClientReport, torch.Tensor]:
        fault = self.fault(client_id, round_idx)
        if fault == "nan_update":
            delta = delta.clone()
            delta[0] = float("nan")
        elif fault == "bad_report":
            report = replace(report, u=float("nan"))
        return report, delta
