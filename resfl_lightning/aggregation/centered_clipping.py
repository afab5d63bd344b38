"""Centered clipping around the previous aggregate (Karimireddy, He & Jaggi, ICML 2021; docs/method.md §10).

v_0 = the previous round's aggregate (0 in the first round); v_{l+1} = v_l + (1/n) sum_i (d_i - v_l)
min(1, tau / ||d_i - v_l||); the round's aggregate is v_L. tau = median_i ||d_i - v_0|| when null (our reading; the
paper's tau is not verified); a number fixes it, as the paper does. `worker_momentum` = beta > 0 adds the paper's
second ingredient: each client sends its momentum m_i = beta m_i + (1 - beta) d_i instead of d_i
(clients/worker_momentum.py; 0, the default, sends d_i). Gather-all (memory N x |theta| float32; L = 1 could stream
with a fixed tau). The previous aggregate lives in ServerState.extra (float64, |theta| values) so that a resumed run
goes on exactly."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.aggregation.robust_ops import centered_clip
from resfl_lightning.clients.worker_momentum import WorkerMomentum
from resfl_lightning.types import ClientReport

PREVIOUS_KEY = "centered_clipping/previous_aggregate"


@dataclass
class CenteredClipping(GatherAllRule):
    uses_client_evaluation = False  # the updates and the previous aggregate only
    on_parameters = True  # compares whole updates: on their parameters (base.py)
    tau: float | None = None  # clipping radius; null: the round's median distance to v_0
    iterations: int = 1  # L
    worker_momentum: float = 0.0  # beta of the clients' momentum; 0: each client sends its update

    def __post_init__(self) -> None:
        self._center: torch.Tensor | None = None  # v_0 of the round (ServerState.extra)
        self._last: torch.Tensor | None = None  # v_L, the next round's v_0
        if self.tau is not None and not self.tau > 0:
            raise ValueError(f"aggregation.tau must be > 0 or null, got {self.tau}")
        if self.iterations < 1:
            raise ValueError(f"aggregation.iterations must be >= 1, got {self.iterations}")
        if not 0 <= self.worker_momentum < 1:
            raise ValueError(f"aggregation.worker_momentum must lie in [0, 1), got {self.worker_momentum}")

    def attach(self, federation, model, layout) -> None:
        super().attach(federation, model, layout)
        if self.worker_momentum > 0:  # client-side: the live client module sends its momentum from now on
            model.add_plugin(WorkerMomentum(self.worker_momentum, self.param_mask))

    def begin_round(self, state, round_idx: int) -> None:
        self._center = state.extra.get(PREVIOUS_KEY)

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        center = (self.parameter_part(self._center, deltas.shape[1]) if self._center is not None
                  else torch.zeros(deltas.shape[1], dtype=torch.float64))
        self._last, _ = centered_clip(deltas, center.to(deltas.device), self.tau, self.iterations)
        return self._last

    def end_round(self, state):
        if self._last is None:
            return state
        return replace(state, extra={**state.extra, PREVIOUS_KEY: self._last.detach().clone()})
