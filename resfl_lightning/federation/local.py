"""One client's local optimisation: the loop shared by federated rounds, shadow models and fine-tuning."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import lightning as L
import torch

from resfl_lightning.clients.base import FederatedClient


def train_epoch(fabric: L.Fabric, client: FederatedClient, optimizer, batches: Iterable, max_norm: float | None,
                name: str) -> list[float]:
    """One pass of SGD steps; returns the pre-clip gradient norms (NaN/inf where AMP skipped the step)."""
    norms = []
    for batch_idx, batch in enumerate(batches):
        batch = fabric.to_device(batch)
        with fabric.autocast():
            loss = client.training_step(batch, batch_idx)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"{name}, batch {batch_idx}: non-finite loss {float(loss)} "
                                     f"(running means: {client.mean_losses()})")
        optimizer.zero_grad(set_to_none=True)
        fabric.backward(loss)
        if max_norm:
            # Fabric unscales AMP gradients before clipping; a non-finite norm makes the scaler skip the step.
            norms.append(float(fabric.clip_gradients(client, optimizer, max_norm=max_norm, error_if_nonfinite=False)))
        else:
            norms.append(float("nan"))
        optimizer.step()
    return norms


def local_train(fabric: L.Fabric, client: FederatedClient, loader_for_epoch: Callable[[int], Iterable],
                epochs: int, lr_factor: float = 1.0, name: str = "client") -> int:
    """SGD over `epochs` passes of loader_for_epoch(epoch); returns the number of optimizer steps."""
    client.train()
    optimizer = client.configure_optimizers()
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * lr_factor
    # Fabric's optimizer wrapper lets the precision plugin unscale AMP gradients and skip overflowing steps.
    optimizer = fabric.setup_optimizers(optimizer)
    steps = 0
    for epoch in range(epochs):
        steps += len(train_epoch(fabric, client, optimizer, loader_for_epoch(epoch), client.optim.grad_clip,
                                 f"{name}, epoch {epoch}"))
    return steps
