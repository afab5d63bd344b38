"""PUFFLE's missing-group fallback (Corbucci et al. 2024; docs/method.md §5a): the server's global P(k|z), pooled
from the clients' noisy counts, stands in for a group absent from a batch (losses/parity.py).

Each round a client counts with the received model over its training split, per group z, the parity mass at each
class k (the sum of p_ik over its rows predicted k) and its rows |Z = z|: a (G, K + 1) table. One row adds at most 1
to one mass cell and 1 to one count, so the table's L2 sensitivity is sqrt(2); under DP it is released with Gaussian
noise of std z_stat sqrt(2) (privacy/dp.py stat_noise_for). The server sums the round's tables and clamps negative
sums at 0 (`pooled_table`); the sum is server state (PARITY_COUNTS_KEY, checkpointed) and reaches every client with
theta next round, where P(k|z) = mass / count for each group counted at least once (`global_rates`). The client
side is clients/parity_term.py's plug-in; `PooledCounts` is the server's."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from resfl_lightning.clients.plugin import ServerPlugin

PARITY_COUNTS_KEY = "parity.global_counts"  # ServerState.extra: the last round's pooled (G, K + 1) table
COUNTS_REPORT_KEY = "parity_counts"  # ClientReport.extras: a client's released table, as nested lists
SENSITIVITY = math.sqrt(2.0)  # L2 change of a table when one row is added or removed


def group_table(mass: torch.Tensor, groups: torch.Tensor, num_groups: int) -> torch.Tensor:
    """(G, K + 1) float64: per group the column sums of mass (N, K), then its row count; rows of an unknown group
    (-1, or >= num_groups) are left out."""
    groups = groups.reshape(-1).long()
    known = (groups >= 0) & (groups < num_groups)
    g, m = groups[known].cpu(), mass[known].detach().to(device="cpu", dtype=torch.float64)
    table = torch.zeros(num_groups, m.shape[1] + 1, dtype=torch.float64)
    table[:, :-1].index_add_(0, g, m)
    table[:, -1] = torch.bincount(g, minlength=num_groups).to(torch.float64)
    return table


def pooled_table(tables: list[torch.Tensor]) -> torch.Tensor | None:
    """The server's sum of the round's tables (in the given order), negative noisy sums clamped at 0; None when no
    finite table arrived."""
    tables = [t for t in tables if t.numel() and bool(torch.isfinite(t).all())]
    if not tables:
        return None
    return torch.stack(tables).sum(dim=0).clamp(min=0.0)


def global_rates(table: torch.Tensor) -> torch.Tensor:
    """(G, K) P(k|z) = mass / count in [0, 1]; NaN rows for groups counted less than once (no fallback)."""
    count = table[:, -1:]
    rates = (table[:, :-1] / count.clamp(min=1.0)).clamp(0.0, 1.0)
    return torch.where(count >= 1.0, rates, torch.full_like(rates, math.nan))


class GlobalParity:
    """Client side: the received P(k|z) the loss falls back on, and the table this client releases this round."""

    def __init__(self, num_groups: int):
        self.num_groups = num_groups
        self.rates: torch.Tensor | None = None
        self.table: torch.Tensor | None = None

    def receive(self, pooled: torch.Tensor | None) -> None:
        """The server's pooled table (None before any client has reported one: no fallback yet)."""
        self.rates = None if pooled is None else global_rates(pooled.to(torch.float64))
        self.table = None

    def release(self, mass: torch.Tensor | None, groups: torch.Tensor | None, std: float | None, seed: int) -> None:
        """Count the round's table (None: no units to count) and noise it with std (None: exact counts)."""
        if mass is None:
            self.table = None
            return
        table = group_table(mass, groups, self.num_groups)
        if std:
            noise = torch.randn(table.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            table = table + std * noise
        self.table = table

    def report(self) -> list[list[float]]:
        return [] if self.table is None else self.table.tolist()


class PooledCounts(ServerPlugin):
    """Server side: next round's global (k, z) counts are the sum of this round's (noisy) client tables; a round
    without any keeps the last sum."""

    def end_round(self, state, reports):
        pooled = pooled_table([torch.tensor(r.extras[COUNTS_REPORT_KEY], dtype=torch.float64) for r in reports
                               if r.extras.get(COUNTS_REPORT_KEY)])
        if pooled is None:
            return state
        return replace(state, extra={**state.extra, PARITY_COUNTS_KEY: pooled})
