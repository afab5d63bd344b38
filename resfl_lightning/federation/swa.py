"""Server SWA (docs/method.md §5a "SWA"): the running average of the global model and the BatchNorm recalibration of
the averaged model without server data.

The average is torch.optim.swa_utils.AveragedModel's: w_SWA <- w_SWA + (w - w_SWA) / (n + 1) on the parameters;
the BatchNorm running statistics are not averaged but copied from the latest model, then recomputed. Recalibration:
each sampled client resets the statistics of w_SWA's BatchNorm layers and makes one no-grad, train-mode pass over
its training split with momentum=None, which leaves the equal-weight mean of its b_k batch means and batch
variances; the server weighs client k by b_k. That equals torch.optim.swa_utils.update_bn on the clients' batches
concatenated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from resfl_lightning.federation.state import FlatLayout

BNStatistics = dict[str, tuple[torch.Tensor, torch.Tensor, int]]  # layer -> (running_mean, running_var, batches)
STAT_KEYS = ("running_mean", "running_var")


def batchnorm_layers(module: nn.Module) -> dict[str, nn.modules.batchnorm._BatchNorm]:
    """BatchNorm layers that keep running statistics, by module name (GroupNorm models have none)."""
    return {name: m for name, m in module.named_modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats}


def statistic_mask(layout: FlatLayout, layers: Iterable[str]) -> torch.Tensor:
    """Bool mask over the flat vector: True at the running_mean / running_var entries of `layers`."""
    keys = {f"{name}.{k}" for name in layers for k in STAT_KEYS}
    return torch.cat([torch.full((n,), key in keys, dtype=torch.bool) for key, n in layout.segments()])


def swa_step(swa: torch.Tensor | None, count: int, theta: torch.Tensor,
             buffers: torch.Tensor | None = None) -> torch.Tensor:
    """w_SWA after folding in `theta` as the (count + 1)-th model; entries under `buffers` (BatchNorm statistics,
    recalibrated afterwards) are not averaged but copied from `theta`, as AveragedModel(use_buffers=False) does."""
    if swa is None or count == 0:
        return theta.clone()
    new = swa + (theta - swa) / (count + 1)
    return new if buffers is None else torch.where(buffers.to(new.device), theta, new)


@torch.no_grad()
def client_bn_statistics(module: nn.Module, forward: Callable[[object], object], loader: Iterable,
                         names: Iterable[str] | None = None) -> BNStatistics:
    """One no-grad, train-mode pass of `forward` over `loader` with the BatchNorm layers `names` (default: all)
    reset and momentum=None (torch's update_bn on this client's batches); returns each layer's statistics and the
    batch count. The momenta and training flag are restored; the running statistics are left recalibrated."""
    layers = batchnorm_layers(module)
    if names is not None:
        layers = {name: layers[name] for name in names}
    momenta = {name: m.momentum for name, m in layers.items()}
    was_training = module.training
    for m in layers.values():
        m.reset_running_stats()
        m.momentum = None
    module.train()
    try:
        with torch.random.fork_rng(devices=[]):  # a DataLoader draws its base seed: the run's RNG stays untouched
            for batch in loader:
                forward(batch)
    finally:
        for name, m in layers.items():
            m.momentum = momenta[name]
        module.train(was_training)
    return {name: (m.running_mean.detach().cpu().clone(), m.running_var.detach().cpu().clone(),
                   int(m.num_batches_tracked)) for name, m in layers.items()}


def combine_bn_statistics(parts: Sequence[Mapping[str, tuple[torch.Tensor, torch.Tensor, int]]]) -> BNStatistics:
    """Per layer: mean = sum_k b_k mean_k / sum_k b_k, the variance likewise, batches = sum_k b_k (float64 sums in
    the order given). Layers no client saw a batch of are left out."""
    out: BNStatistics = {}
    for name in (parts[0] if parts else {}):
        batches = [p[name][2] for p in parts]
        total = sum(batches)
        if total == 0:
            continue
        mean = sum(p[name][0].double() * b for p, b in zip(parts, batches)) / total
        var = sum(p[name][1].double() * b for p, b in zip(parts, batches)) / total
        out[name] = (mean.float(), var.float(), total)
    return out


def write_bn_statistics(flat: torch.Tensor, layout: FlatLayout, stats: Mapping[str, tuple]) -> torch.Tensor:
    """A copy of `flat` with the running_mean / running_var entries of the layers in `stats` replaced."""
    out, offset = flat.clone(), 0
    for key, n in layout.segments():
        layer, _, leaf = key.rpartition(".")
        if leaf in STAT_KEYS and layer in stats:
            value = stats[layer][STAT_KEYS.index(leaf)]
            out[offset: offset + n] = value.reshape(-1).to(out.dtype).to(out.device)
        offset += n
    return out
