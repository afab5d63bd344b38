"""One client's local optimisation: the loop shared by federated rounds, shadow models and fine-tuning."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import lightning as L
import torch

from resfl_lightning.clients.base import FederatedClient, first_failure


@torch.no_grad()
def sam_ascent(params: list[torch.nn.Parameter], rho: float) -> list[torch.Tensor] | None:
    """SAM's first step (Foret et al. 2021): move theta to theta + rho g/||g||; returns the offsets to undo.

    Scaled (AMP) gradients give the same direction, so no unscaling is needed. A zero or non-finite norm makes every
    offset zero (decided on the device: no host read per step), so the second pass is taken at theta itself and the
    step behaves like plain SGD (with a non-finite gradient the AMP scaler skips it anyway)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    usable = torch.isfinite(norm) & (norm > 0)
    scale = torch.where(usable, rho / norm, torch.zeros_like(norm))
    offsets = []
    for p in params:
        if p.grad is None:
            e = torch.zeros_like(p)
        else:  # where(), not a product with 0: a NaN or inf gradient times 0 would still be NaN
            e = torch.where(usable, p.grad * scale.to(p.dtype), torch.zeros_like(p))
        p.add_(e)
        offsets.append(e)
    return offsets


@torch.no_grad()
def sam_descent_point(params: list[torch.nn.Parameter], offsets: list[torch.Tensor]) -> None:
    """Back to theta, keeping the gradients taken at the perturbed point (SAM's second step uses them)."""
    for p, e in zip(params, offsets):
        p.sub_(e)


def train_epoch(fabric: L.Fabric, client: FederatedClient, optimizer, batches: Iterable, max_norm: float | None,
                name: str, local_optimizers: list | None = None, sam_rho: float = 0.0) -> list[float]:
    """One pass of SGD (or SAM) steps; returns the pre-clip gradient norms (NaN/inf where AMP skipped the step).

    `optimizer` steps theta; `local_optimizers` step the client-local modules (the adversary phi) on the same
    backward pass, at their own learning rate."""
    local_optimizers = local_optimizers or []
    optimizers = [optimizer, *local_optimizers]
    shared = client.shared_parameters() if sam_rho > 0 else []
    norms = []
    client.take_batch_checks()  # this epoch's checks only (a step taken outside the loop may have left some)
    bad = None  # index of the first batch with a non-finite loss, kept on the device (no per-step host sync)
    for batch_idx, batch in enumerate(batches):
        batch = fabric.to_device(batch)
        own_step = client.step_without_loss(batch, optimizer)  # e.g. DP-SGD's noise-only step on an empty draw
        if own_step is not None:
            norms.append(own_step)
            continue
        with fabric.autocast():
            loss = client.training_step(batch, batch_idx)
        bad = _first_nonfinite(bad, loss, batch_idx)
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        fabric.backward(loss)
        if sam_rho > 0:
            offsets = sam_ascent(shared, sam_rho)
            if offsets is not None:
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                with fabric.autocast():
                    perturbed = client.training_step(batch, batch_idx)
                fabric.backward(perturbed)
                sam_descent_point(shared, offsets)
        if max_norm:
            # Fabric unscales AMP gradients before clipping (theta's optimizer only: phi is not clipped with it).
            norms.append(fabric.clip_gradients(client, optimizer, max_norm=max_norm, error_if_nonfinite=False).detach())
        else:
            norms.append(loss.new_tensor(float("nan")))
        for opt in optimizers:
            opt.step()
        client.end_step()
        client.extra_adversary_steps([getattr(o, "optimizer", o) for o in local_optimizers])
    raise_failed_checks(client, bad, name)
    return torch.stack(norms).tolist() if norms else []


def raise_failed_checks(client: FederatedClient, bad_loss: torch.Tensor | None, name: str) -> None:
    """The epoch's one read-back of its device-side checks: the clients' input checks (FederatedClient.check_batch:
    labels, group indices) raise a ValueError, then a non-finite loss a FloatingPointError; each names `name` (client,
    round, epoch) and the first failing batch."""
    checks = client.take_batch_checks()
    firsts = [c.first for c in checks.values()] + ([] if bad_loss is None else [bad_loss])
    if not firsts:
        return
    read = torch.stack([f.to(firsts[0].device) for f in firsts]).tolist()
    for (problem, check), batch in zip(checks.items(), read):
        if batch >= 0:  # an error path: reading the offending values back costs nothing that matters
            values = "" if check.detail is None else ": " + ", ".join(str(v) for v in check.detail.tolist())
            raise ValueError(f"{name}, batch {batch}: {problem}{values}")
    if bad_loss is not None and read[-1] >= 0:
        raise FloatingPointError(f"{name}, batch {read[-1]}: non-finite loss (running means: {client.mean_losses()})")


def _first_nonfinite(bad: torch.Tensor | None, loss: torch.Tensor, batch_idx: int) -> torch.Tensor:
    return first_failure(bad, ~torch.isfinite(loss.detach()), batch_idx)


def local_train(fabric: L.Fabric, client: FederatedClient, loader_for_epoch: Callable[[int], Iterable],
                epochs: int, lr_factor: float = 1.0, name: str = "client", sam_rho: float = 0.0,
                epoch_end: Callable[[int], None] | None = None) -> int:
    """SGD (or SAM) over `epochs` passes of loader_for_epoch(epoch); returns the number of optimizer steps.

    `epoch_end(epoch)` runs after each epoch (CurvFed's per-epoch evaluation and best-epoch selection)."""
    client.start_local_training(loader_for_epoch)
    client.train()
    optimizer = client.configure_optimizers()
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * lr_factor
    # Fabric's optimizer wrapper lets the precision plugin unscale AMP gradients and skip overflowing steps.
    optimizer = fabric.setup_optimizers(optimizer)
    local_optimizers = [fabric.setup_optimizers(o) for o in client.local_optimizers()]
    steps = 0
    for epoch in range(epochs):
        batches = client.epoch_batches(loader_for_epoch(epoch))
        client.begin_epoch(epoch, epochs, len(batches) if hasattr(batches, "__len__") else None)
        steps += len(train_epoch(fabric, client, optimizer, batches, client.optim.grad_clip,
                                 f"{name}, epoch {epoch}", local_optimizers, sam_rho))
        if epoch_end is not None:
            epoch_end(epoch)
    return steps
