"""What a federated method adds at the client/server boundary, as plug-ins with no-op hooks.

A method's Algorithm class (resfl_lightning/algorithms/) lists its `ClientPlugin`s, attached to every freshly built
client module (FederatedClient.plugins, called in that order), and its `ServerPlugin`s, which the orchestrator
calls at each round's end. The core calls every hook; a hook a plug-in does not override does nothing.

One round of one client, in hook order (federation/orchestrator.py, federation/local.py, clients/base.py):
    import_state           the client's own state (None: a client seen for the first time)
    receive                what the server sent with theta_G (ServerState.extra)
    begin_round            theta_G loaded, before any local work
    start_training         before the first step, with the training loader factory
    wrap_optimizer, set_training, loader, step_without_loss    the local loop's optimiser, train mode and batches
    loss_term, weigh_term  the step's own loss term and how it enters the loss
    after_step             after every optimizer step
    before_upload          after local training, before the update is taken
    sent_update            the update the client sends instead of theta_i - theta_G (worker momentum)
    report                 entries of ClientReport.extras
    export_state           kept for the client's next round (never sent)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, NamedTuple

import torch

from resfl_lightning.types import ClientReport


class TermWeights(NamedTuple):
    """How a plug-in's term enters the step's loss: share x lambda_task L_task + ... + weight x term (a float or a
    0-d tensor each); `logged`: running means to record (FederatedClient.mean_losses, `loss_<key>`)."""

    task_share: float | torch.Tensor
    weight: float | torch.Tensor
    logged: dict[str, torch.Tensor]


class ClientPlugin:
    """One method's part of one live client module; its state is the client's own (export_state / import_state)."""

    per_example_loss: ClassVar[bool] = False  # the step's loss must be a mean of per-example losses (DP-SGD)

    def receive(self, client: Any, sent: Mapping[str, torch.Tensor]) -> None:
        """What the server pools for the clients (ServerPlugin.end_round), sent with theta_G."""

    def begin_round(self, client: Any) -> None:
        """A client-round starts: theta_G and the client's own state are loaded."""

    def start_training(self, client: Any, loader_for_epoch: Callable[[int], Iterable]) -> None:
        """Before the round's first local step; loader_for_epoch(e) is the training split's loader of epoch e."""

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The local optimiser of theta the loop steps."""
        return optimizer

    def set_training(self, mode: bool) -> None:
        """The client module entered train (True) or eval mode."""

    def loader(self, batches: Iterable) -> Iterable:
        """One local epoch's batches (the training split's loader of that epoch)."""
        return batches

    def step_without_loss(self, batch: Any, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """A step this plug-in takes itself instead of the loss's (its gradient norm, a tensor); None: none."""
        return None

    def loss_term(self, client: Any, outputs: Any, batch: dict) -> torch.Tensor | None:
        """This step's own loss term, from the step's model outputs (None: the loss is left as it is)."""
        return None

    def weigh_term(self, term: torch.Tensor, task: torch.Tensor) -> TermWeights:
        """The weights of the term `loss_term` gave, given the step's task loss."""
        return TermWeights(1.0, 1.0, {})

    def after_step(self, client: Any) -> None:
        """After each optimizer step."""

    def before_upload(self, client: Any, val_loader: Iterable) -> None:
        """After local training, before the update theta_i - theta_G is taken."""

    def sent_update(self, client: Any, delta: torch.Tensor) -> torch.Tensor:
        """The flat update the client sends, given theta_i - theta_G (or what an earlier plug-in made of it)."""
        return delta

    def report(self, client: Any, val_loader: Iterable) -> dict[str, Any]:
        """Entries of the round's ClientReport.extras: scalars or aggregate counts, never per-sample values."""
        return {}

    def export_state(self) -> dict[str, torch.Tensor]:
        """This plug-in's client-local state (ClientStateStore; never sent to the server)."""
        return {}

    def import_state(self, state: Mapping[str, torch.Tensor] | None) -> None:
        """The client's own state as export_state left it (None: a client seen for the first time)."""


class ServerPlugin:
    """One method's server side: what the server pools from a round's reports for the next round's clients."""

    def end_round(self, state: Any, reports: list[ClientReport]) -> Any:
        """The ServerState after the round's aggregation (its `extra` reaches ClientPlugin.receive)."""
        return state
