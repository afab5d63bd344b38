"""Centered clipping around the previous aggregate (Karimireddy, He & Jaggi, ICML 2021; docs/method.md §10).

v_0 = the previous round's aggregate (0 in the first round); v_{l+1} = v_l + (1/n) sum_i (d_i - v_l)
min(1, tau / ||d_i - v_l||); the round's aggregate is v_L. tau = median_i ||d_i - v_0|| when null (our reading; the
paper's tau is not verified). Gather-all (memory N x |theta| float32; L = 1 could stream with a fixed tau). The
previous aggregate lives in ServerState.extra (float64, |theta| values) so that a resumed run goes on exactly."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.aggregation.robust_ops import centered_clip
from resfl_lightning.types import ClientReport

PREVIOUS_KEY = "centered_clipping/previous_aggregate"


@dataclass
class CenteredClipping(GatherAllRule):
    uses_client_evaluation = False  # the updates and the previous aggregate only
    on_parameters = True  # compares whole updates: on their parameters (base.py)
    tau: float | None = None  # clipping radius; null: the round's median distance to v_0
    iterations: int = 1  # L

    def __post_init__(self) -> None:
        self._center: torch.Tensor | None = None  # v_0 of the round (ServerState.extra)
        self._last: torch.Tensor | None = None  # v_L, the next round's v_0
        if self.tau is not None and not self.tau > 0:
            raise ValueError(f"aggregation.tau must be > 0 or null, got {self.tau}")
        if self.iterations < 1:
            raise ValueError(f"aggregation.iterations must be >= 1, got {self.iterations}")

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
