"""One client's local optimisation: the loop shared by federated rounds and attack shadow models."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import lightning as L
import torch

from resfl_lightning.clients.base import FederatedClient


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
        for batch_idx, batch in enumerate(loader_for_epoch(epoch)):
            batch = fabric.to_device(batch)
            with fabric.autocast():
                loss = client.training_step(batch, batch_idx)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"{name}, epoch {epoch}, batch {batch_idx}: non-finite loss {float(loss)} "
                                         f"(running means: {client.mean_losses()})")
            optimizer.zero_grad(set_to_none=True)
            fabric.backward(loss)
            if client.optim.grad_clip:
                fabric.clip_gradients(client, optimizer, max_norm=client.optim.grad_clip, error_if_nonfinite=False)
            optimizer.step()
            steps += 1
    return steps
