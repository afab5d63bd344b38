"""Evidential losses: Dirichlet classification (Sensoy et al. 2018) and Normal-Inverse-Gamma regression (Amini et al.
2020), plus the group-balanced mean used for L_unc. Class dimension is always the last one; functions are per row."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

NIG_EPS = 1e-6


def dirichlet_alpha(logits: torch.Tensor) -> torch.Tensor:
    """Dirichlet concentration alpha = 1 + softplus(logits) (> 1, so every outcome keeps some evidence floor)."""
    return 1.0 + F.softplus(logits)


def _check_pair(alpha: torch.Tensor, y: torch.Tensor, name: str) -> None:
    if alpha.shape != y.shape:
        raise ValueError(f"{name}: alpha {tuple(alpha.shape)} and targets {tuple(y.shape)} must have the same shape")


def dirichlet_nll(alpha: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Type-II ML loss sum_c y_c (log alpha_0 - log alpha_c) per row; y may be soft (e.g. task-aligned scores)."""
    _check_pair(alpha, y, "dirichlet_nll")
    alpha0 = alpha.sum(dim=-1, keepdim=True)
    return (y * (torch.log(alpha0) - torch.log(alpha))).sum(dim=-1)


def dirichlet_kl_uniform(alpha: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """KL(Dir(alpha~) || Dir(1)) per row, alpha~ = y + (1 - y) alpha (target evidence removed; soft y allowed)."""
    _check_pair(alpha, y, "dirichlet_kl_uniform")
    a = y + (1.0 - y) * alpha
    a0 = a.sum(dim=-1)
    k = a.shape[-1]
    return (
        torch.lgamma(a0)
        - math.lgamma(k)
        - torch.lgamma(a).sum(dim=-1)
        + ((a - 1.0) * (torch.digamma(a) - torch.digamma(a0).unsqueeze(-1))).sum(dim=-1)
    )


def annealing_coefficient(t: float, t_anneal: float) -> float:
    """min(1, t / t_anneal); t_anneal == 0 means no annealing (coefficient 1)."""
    if t < 0 or t_anneal < 0:
        raise ValueError(f"annealing_coefficient: t ({t}) and t_anneal ({t_anneal}) must be >= 0")
    if t_anneal == 0:
        return 1.0
    return min(1.0, float(t) / float(t_anneal))


def expected_probability(alpha: torch.Tensor) -> torch.Tensor:
    """E[p_c] = alpha_c / alpha_0 (the detection score)."""
    return alpha / alpha.sum(dim=-1, keepdim=True)


def dirichlet_uncertainty(alpha: torch.Tensor) -> torch.Tensor:
    """u_cls = 1 / (alpha_0 + 1), one value per row."""
    return 1.0 / (alpha.sum(dim=-1) + 1.0)


def dirichlet_variance(alpha: torch.Tensor) -> torch.Tensor:
    """Var[p_c] = p_c (1 - p_c) / (alpha_0 + 1) per class."""
    alpha0 = alpha.sum(dim=-1, keepdim=True)
    p = alpha / alpha0
    return p * (1.0 - p) / (alpha0 + 1.0)


def nig_params(raw: torch.Tensor, eps: float = NIG_EPS) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Map raw (..., 3) outputs to NIG (nu > 0, alpha > 1, beta > 0); gamma is the regressed coordinate itself."""
    if raw.shape[-1] != 3:
        raise ValueError(f"nig_params: last dimension must be 3 (nu, alpha, beta), got {tuple(raw.shape)}")
    sp = F.softplus(raw)
    return sp[..., 0] + eps, 1.0 + sp[..., 1] + eps, sp[..., 2] + eps


def nig_nll(
    y: torch.Tensor, gamma: torch.Tensor, nu: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor
) -> torch.Tensor:
    """Elementwise NIG negative log marginal likelihood (Amini et al. Eq. 8) = -log St(y; 2a, gamma, b(1+nu)/(nu a))."""
    omega = 2.0 * beta * (1.0 + nu)
    return (
        0.5 * torch.log(math.pi / nu)
        - alpha * torch.log(omega)
        + (alpha + 0.5) * torch.log(nu * (y - gamma) ** 2 + omega)
        + torch.lgamma(alpha)
        - torch.lgamma(alpha + 0.5)
    )


def nig_regulariser(y: torch.Tensor, gamma: torch.Tensor, nu: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Elementwise evidence regulariser |y - gamma| (2 nu + alpha): penalises evidence on wrong predictions."""
    return (y - gamma).abs() * (2.0 * nu + alpha)


def nig_epistemic_variance(
    nu: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, eps: float = NIG_EPS
) -> torch.Tensor:
    """Var[mu] = beta / (nu (alpha - 1 + eps))."""
    return beta / (nu * (alpha - 1.0 + eps))


def group_balanced_mean(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Mean per sensitive group (groups >= 0 only), then mean over the groups present; graph-connected 0 if none."""
    values = values.reshape(-1)
    groups = groups.reshape(-1).to(values.device).long()
    if values.shape[0] != groups.shape[0]:
        raise ValueError(f"group_balanced_mean: {values.shape[0]} values but {groups.shape[0]} group labels")
    known = groups >= 0
    v, g = values[known], groups[known]
    if v.numel() == 0:
        return v.sum() * 0.0  # empty selection: zero that still backpropagates
    present, inverse, counts = torch.unique(g, return_inverse=True, return_counts=True)
    sums = torch.zeros(present.shape[0], dtype=v.dtype, device=v.device).index_add(0, inverse, v)
    return (sums / counts.to(v.dtype)).mean()
