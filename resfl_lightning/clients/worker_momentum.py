"""Worker momentum (Karimireddy, He & Jaggi, ICML 2021, the second ingredient of centered clipping; docs/method.md
§10): each client sends m_i <- beta m_i + (1 - beta) delta_i instead of its update delta_i, m_i = 0 before its first
round. On the parameter coordinates only: the float buffers (BatchNorm statistics) are no gradient and are sent as
they are. m_i is the client's own state (ClientStateStore), so a resumed run goes on exactly; memory |theta| float32
per client there."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from resfl_lightning.clients.plugin import ClientPlugin

MOMENTUM_KEY = "worker_momentum.m"


class WorkerMomentum(ClientPlugin):
    def __init__(self, beta: float, param_mask: torch.Tensor | None = None):
        if not 0 <= beta < 1:
            raise ValueError(f"aggregation.worker_momentum must lie in [0, 1), got {beta}")
        self.beta, self.param_mask = beta, param_mask
        self.momentum: torch.Tensor | None = None  # of the client whose state was imported last

    def import_state(self, state: Mapping[str, torch.Tensor] | None) -> None:
        self.momentum = None if state is None else state.get(MOMENTUM_KEY)

    def export_state(self) -> dict[str, torch.Tensor]:
        return {} if self.momentum is None else {MOMENTUM_KEY: self.momentum}

    def sent_update(self, client, delta: torch.Tensor) -> torch.Tensor:
        mask = (torch.ones(delta.numel(), dtype=torch.bool) if self.param_mask is None else self.param_mask)
        mask = mask.to(delta.device)
        new = (1 - self.beta) * delta[mask].to(torch.float64)
        if self.momentum is not None:
            new = new + self.beta * self.momentum.to(delta.device, torch.float64)
        self.momentum = new.to(delta.dtype)
        sent = delta.clone()
        sent[mask] = self.momentum
        return sent
