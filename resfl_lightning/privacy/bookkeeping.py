"""Book-keeping per-example clipping for nn.Linear (Bu et al., "Differentially private optimization on large model at
small cost", 2023): the per-sample norms and the clipped sum come from the layer's input a (B, in) and output
gradient g (B, out) of the one backward pass, never from the B x out x in per-sample gradients opacus materialises.

For sample i the weight's gradient is g_i a_i^T, so ||g_i a_i^T||_F = ||g_i|| ||a_i|| and sum_i c_i g_i a_i^T =
(c * g)^T a. Equal to opacus' per-sample path in exact arithmetic, not bitwise (the sums run in another order). On
Adult's MLP the materialised gradients and their norms were ~40 % of a FedAvg-DP run (docs/performance.md).

opacus' hooks still run for every layer; the Linear sampler returns a zero-stride placeholder shaped like the
per-sample gradients (no memory) that carries (a, g). Every other layer (GroupNorm, conv, a Linear over sequences)
keeps opacus' own per-sample gradients, and a placeholder is materialised wherever opacus would combine it with
another tensor (a layer used twice in one forward, gradients of two backward passes before one step).
"""

from __future__ import annotations

import torch
from opacus import GradSampleModule
from opacus.grad_sample.linear import compute_linear_grad_sample
from torch import nn

_FACTORS = "_resfl_factors"  # on a placeholder: ("weight" | "bias", a, g)


def _placeholder(param: torch.Tensor, kind: str, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    out = g.new_zeros(()).expand(g.shape[0], *param.shape)
    setattr(out, _FACTORS, (kind, a, g))
    return out


def is_factored(grad_sample) -> bool:
    return isinstance(grad_sample, torch.Tensor) and hasattr(grad_sample, _FACTORS)


def holds_factors(grad_sample) -> bool:
    """A placeholder, or a list (gradients of several backward passes) with one in it."""
    if isinstance(grad_sample, list):
        return any(is_factored(s) for s in grad_sample)
    return is_factored(grad_sample)


def factored_linear_grad_sample(layer: nn.Linear, activations: list[torch.Tensor],
                                backprops: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """opacus' Linear grad sampler, with placeholders instead of per-sample gradients for a (B, in) input."""
    if backprops.dim() != 2:
        return compute_linear_grad_sample(layer, activations, backprops)
    a = activations[0].to(backprops.dtype)
    out = {}
    if layer.weight.requires_grad:
        out[layer.weight] = _placeholder(layer.weight, "weight", a, backprops)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = _placeholder(layer.bias, "bias", a, backprops)
    return out


def materialise(grad_sample: torch.Tensor) -> torch.Tensor:
    """The per-sample gradients a placeholder stands for (opacus' own formulas)."""
    kind, a, g = getattr(grad_sample, _FACTORS)
    if kind == "bias":
        return g.clone()
    return torch.einsum("ni,nj->nij", g, a)


def dense(grad_sample) -> torch.Tensor:
    """The per-sample gradients as a tensor, whichever way they are held (for checks and reports, not the step)."""
    grad_sample = flat(grad_sample)
    return materialise(grad_sample) if is_factored(grad_sample) else grad_sample


def flat(grad_sample) -> torch.Tensor:
    """A parameter's grad_sample as one tensor: a placeholder stays factored, a list is concatenated (placeholders in
    it materialised, where opacus' own concatenation would copy the placeholder's zeros)."""
    if isinstance(grad_sample, list):
        return torch.cat([materialise(s) if is_factored(s) else s for s in grad_sample], dim=0)
    return grad_sample


def per_sample_norms(grad_sample: torch.Tensor) -> torch.Tensor:
    """(B,) norms of each sample's gradient: ||g_i|| ||a_i|| for a weight, ||g_i|| for a bias; opacus' for a tensor."""
    if not is_factored(grad_sample):
        return grad_sample.reshape(len(grad_sample), -1).norm(2, dim=-1)
    kind, a, g = getattr(grad_sample, _FACTORS)
    g2 = (g * g).sum(dim=1)
    return torch.sqrt(g2 if kind == "bias" else g2 * (a * a).sum(dim=1))


def clipped_sum(grad_sample: torch.Tensor, clip: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """sum_i clip_i * (sample i's gradient): (clip * g)^T a for a weight, clip @ g for a bias; opacus' einsum else."""
    clip = clip.to(device=grad_sample.device, dtype=dtype)
    if not is_factored(grad_sample):
        return torch.einsum("i,i...", clip, grad_sample.to(dtype))
    kind, a, g = getattr(grad_sample, _FACTORS)
    g = g.to(dtype)
    if kind == "bias":
        return clip @ g
    return (g * clip[:, None]).t() @ a.to(dtype)


class BookkeepingGradSampleModule(GradSampleModule):
    """opacus' GradSampleModule whose nn.Linear sampler keeps (a, g) instead of per-sample gradients."""

    GRAD_SAMPLERS = {**GradSampleModule.GRAD_SAMPLERS, nn.Linear: factored_linear_grad_sample}
