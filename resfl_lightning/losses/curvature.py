"""CurvFed curvature term: top eigenpair of the empirical Fisher F = (1/B) J^T J (J = d losses / d theta, B x P),
found by power iteration on Fisher-vector products, never materialising F or per-sample gradients.

J v uses the double-vjp trick: g(u) = J^T u is linear in a dummy u, so d(g . v)/du = J v. It needs only reverse-mode
AD, so it works with BatchNorm in train mode (where forward-mode jvp and per-sample vmap do not)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

ParamFilter = Callable[[str], bool] | str | Sequence[str] | None


def _select_samples(per_sample_losses: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    losses = per_sample_losses.reshape(-1)
    if not losses.requires_grad:
        raise ValueError("Fisher curvature: per_sample_losses must require grad (computed from the parameters)")
    if mask is None:
        return losses
    mask = mask.reshape(-1)
    if mask.dtype != torch.bool or mask.shape[0] != losses.shape[0]:
        raise ValueError(
            f"Fisher curvature: mask must be bool of length {losses.shape[0]}, got {mask.dtype} {tuple(mask.shape)}"
        )
    return losses[mask.to(losses.device)]


def _dot(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> torch.Tensor:
    return sum((x * y).sum() for x, y in zip(a, b, strict=True))


def _norm(a: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(_dot(a, a))


class _FisherOperator:
    """J v, J^T w and F v for fixed losses/params; the g(u) graph is built once and reused across power iterations."""

    def __init__(self, losses: torch.Tensor, params: Sequence[torch.Tensor]) -> None:
        self.losses = losses
        self.params = list(params)
        self.n = losses.shape[0]
        self.u = torch.zeros_like(losses, requires_grad=True)
        grads = torch.autograd.grad(losses, self.params, grad_outputs=self.u, create_graph=True, allow_unused=True)
        # Parameters the losses do not reach have a zero Jacobian column; leave them out of the double vjp.
        self.used = [i for i, g in enumerate(grads) if g is not None and g.requires_grad]
        self.g = [grads[i] for i in self.used]

    def jv(self, v: Sequence[torch.Tensor], create_graph: bool = False) -> torch.Tensor:
        """(B,) vector J v; with create_graph it stays differentiable w.r.t. the parameters."""
        if not self.used:
            return self.losses.new_zeros(self.n)
        (out,) = torch.autograd.grad(
            self.g,
            self.u,
            grad_outputs=[v[i] for i in self.used],
            retain_graph=True,
            create_graph=create_graph,
            allow_unused=True,
        )
        return self.losses.new_zeros(self.n) if out is None else out

    def jtw(self, w: torch.Tensor) -> list[torch.Tensor]:
        """J^T w as a detached list shaped like the parameters."""
        grads = torch.autograd.grad(self.losses, self.params, grad_outputs=w, retain_graph=True, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(self.params, grads, strict=True)]

    def fvp(self, v: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """F v = (1/B) J^T (J v)."""
        return [x / self.n for x in self.jtw(self.jv(v).detach())]

    def curvature(self, v: Sequence[torch.Tensor]) -> torch.Tensor:
        """v^T F v = (1/B) ||J v||^2 with v held constant, differentiable w.r.t. the parameters."""
        return self.curvature_and_product(v)[0]

    def curvature_and_product(self, v: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """v^T F v as in :meth:`curvature`, and F v (detached), which its gradient computes anyway.

        Differentiating ||J v||^2 directly needs third-order AD (BatchNorm has none). Its gradient is
        (2/B) sum_i c_i grad(g_i . v) with c = J v, i.e. the gradient of s = (2/B) v . grad(c . losses) for c held
        constant, which only needs second order; return value + s - s.detach() (value of one, gradient of the other).
        grad(c . losses) = J^T J v = B F v: one power-iteration step comes with the term at no extra J v."""
        v = [x.detach() for x in v]
        c = self.jv(v).detach()
        value = c.pow(2).sum() / self.n
        grads = torch.autograd.grad(self.losses, self.params, grad_outputs=c, create_graph=True, allow_unused=True)
        fv = [torch.zeros_like(p) if g is None else g.detach() / self.n
              for p, g in zip(self.params, grads, strict=True)]
        terms = [(g * x).sum() for g, x in zip(grads, v, strict=True) if g is not None and g.requires_grad]
        if not terms:
            return value + self.losses.sum() * 0.0, fv
        s = (2.0 / self.n) * sum(terms)
        return value + (s - s.detach()), fv


def _initial_vector(
    params: Sequence[torch.Tensor], v0: Sequence[torch.Tensor] | None, generator: torch.Generator | None
) -> list[torch.Tensor]:
    if v0 is not None:
        v0 = list(v0)
        if len(v0) != len(params) or any(a.shape != p.shape for a, p in zip(v0, params, strict=True)):
            raise ValueError(
                "Fisher curvature: warm-start vector shapes "
                f"{[tuple(a.shape) for a in v0]} do not match parameter shapes {[tuple(p.shape) for p in params]}"
            )
        v = [a.detach().to(device=p.device, dtype=p.dtype) for a, p in zip(v0, params, strict=True)]
        norm = _norm(v)  # once: a norm per parameter tensor made every warm start O(P^2)
        if float(norm) > 0.0:
            return [x / norm for x in v]
    v = [torch.randn(p.shape, generator=generator, dtype=p.dtype).to(p.device) for p in params]
    n = _norm(v)
    return [x / n for x in v]


def _power_iteration(
    op: _FisherOperator, v: list[torch.Tensor], iters: int, tol: float
) -> tuple[float, list[torch.Tensor], int]:
    eig = 0.0
    for k in range(1, iters + 1):
        w = op.fvp(v)
        eig = float(_dot(v, w))  # Rayleigh quotient of the current unit vector
        w_norm = float(_norm(w))
        if w_norm == 0.0:  # F v = 0: zero curvature along v (e.g. saturated losses); nothing to iterate on
            return 0.0, v, k
        # Relative residual ||F v - lambda v|| / ||F v|| is 0 exactly at an eigenvector, so warm starts stop early.
        residual = float(_norm([a - eig * b for a, b in zip(w, v, strict=True)])) / w_norm
        v = [a / w_norm for a in w]
        if residual <= tol:
            break
    return eig, v, k


def _check_params(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    params = list(params)
    if not params:
        raise ValueError("Fisher curvature: the parameter list is empty")
    return params


def _check_iters(iters: int, tol: float) -> None:
    if iters < 1:
        raise ValueError(f"Fisher power iteration needs iters >= 1, got {iters}")
    if tol < 0:
        raise ValueError(f"Fisher power iteration needs tol >= 0, got {tol}")


def fisher_vector_product(
    per_sample_losses: torch.Tensor, params: Sequence[torch.Tensor], v: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """F v for the empirical Fisher of ``per_sample_losses`` (B,) over ``params`` (detached, shaped like params)."""
    return _FisherOperator(_select_samples(per_sample_losses, None), _check_params(params)).fvp(v)


def fisher_power_iteration(
    per_sample_losses: torch.Tensor,
    params: Sequence[torch.Tensor],
    v0: Sequence[torch.Tensor] | None = None,
    iters: int = 20,
    tol: float = 1e-3,
    mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[float, list[torch.Tensor], int]:
    """Like :func:`fisher_top_eigenpair` but also returns the number of iterations run."""
    _check_iters(iters, tol)
    params = _check_params(params)
    v = _initial_vector(params, v0, generator)
    losses = _select_samples(per_sample_losses, mask)
    if losses.shape[0] == 0:
        return 0.0, v, 0
    return _power_iteration(_FisherOperator(losses, params), v, iters, tol)


def fisher_top_eigenpair(
    per_sample_losses: torch.Tensor,
    params: Sequence[torch.Tensor],
    v0: Sequence[torch.Tensor] | None = None,
    iters: int = 20,
    tol: float = 1e-3,
    mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[float, list[torch.Tensor]]:
    """Top eigenvalue and unit eigenvector (detached list) of F, by power iteration warm-started from ``v0``.

    Stops when ||F v - lambda v|| / ||F v|| <= tol; ``mask`` (bool, (B,)) keeps only e.g. correctly classified samples
    (eigenvalue 0 and the start vector when none are kept)."""
    eig, v, _ = fisher_power_iteration(per_sample_losses, params, v0, iters, tol, mask, generator)
    return eig, v


def fisher_curvature_loss(
    per_sample_losses: torch.Tensor,
    params: Sequence[torch.Tensor],
    v: Sequence[torch.Tensor],
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_curv = v^T F v = (1/B) ||J v||^2 with v detached; differentiable in params (graph-connected 0 if no sample)."""
    losses = _select_samples(per_sample_losses, mask)
    if losses.shape[0] == 0:
        return losses.sum() * 0.0
    return _FisherOperator(losses, _check_params(params)).curvature(v)


def _name_predicate(param_filter: ParamFilter) -> Callable[[str], bool]:
    if param_filter is None:
        return lambda name: True
    if isinstance(param_filter, str):
        return lambda name: name.startswith(param_filter)
    if callable(param_filter):
        return param_filter
    prefixes = tuple(param_filter)
    return lambda name: name.startswith(prefixes)


CURV_DIRECTIONS = ("converged", "held")  # algorithm.curv_direction: FisherCurvature's `direction`
_REFRESH_STREAM = 0x43555256  # the refresh draws' own stream beside the cold-start vectors' (same client seed)


class FisherCurvature:
    """Stateful L_curv: keeps the power-iteration vector between steps as a warm start.

    ``param_filter``: None (all trainable parameters), a name prefix, a sequence of prefixes, or a predicate on
    parameter names. Call with the per-sample losses and the model (or an explicit parameter list).

    ``refresh`` = k > 1 computes the term on a step with probability 1/k (a seeded draw) and weighs it by k, a zero
    otherwise: the same loss in expectation at 1/k of the cost (docs/performance.md, "The curvature row"); the power
    iteration then runs only on those steps, warm-started from the vector they last held. k = 1 draws nothing.
    `due()` draws a step's decision ahead, so that a caller skips preparing the samples (CurvFed's correct images)
    on a step that will not use them; the next call takes that decision instead of drawing.

    ``direction``: ``converged`` power-iterates (up to ``iters``) on each step's Fisher and takes the term along the
    vector found; ``held`` takes it along the vector held from the last step, v^T F_t v, and moves that vector one
    power-iteration step, F_t v / ||F_t v||, with the product the term's own gradient computes: one J v a step
    instead of iters + 1. Over steps it is the power iteration warm-started across steps, so on a Fisher that moves
    slowly v follows its top eigenvector (tests/unit/losses/test_curvature.py); a cold start (no vector held, the
    first step of a client) runs ``iters`` iterations first."""

    def __init__(self, iters: int = 10, param_filter: ParamFilter = None, tol: float = 1e-3, seed: int = 0,
                 refresh: int = 1, direction: str = "converged") -> None:
        _check_iters(iters, tol)
        if refresh < 1:
            raise ValueError(f"FisherCurvature: refresh must be >= 1, got {refresh}")
        if direction not in CURV_DIRECTIONS:
            raise ValueError(f"FisherCurvature: direction must be one of {CURV_DIRECTIONS}, got {direction!r}")
        self.direction = direction
        self.iters = iters
        self.tol = tol
        self.refresh = refresh
        self.param_filter = param_filter
        self._predicate = _name_predicate(param_filter)
        self._generator = torch.Generator().manual_seed(seed)
        self._draws = torch.Generator().manual_seed(seed ^ _REFRESH_STREAM)
        self.v: list[torch.Tensor] | None = None
        self.last_eigenvalue = 0.0
        self.last_iterations = 0
        self._ahead: bool | None = None  # a decision due() drew for the next call

    def due(self) -> bool:
        """Whether the next call computes the term (drawn now with probability 1/refresh; always with refresh 1)."""
        if self._ahead is None:
            self._ahead = self.refresh == 1 or float(
                torch.rand((), generator=self._draws, dtype=torch.float64)) < 1.0 / self.refresh
        return self._ahead

    def reset(self) -> None:
        """Forget the warm-start vector (e.g. after loading a new global model)."""
        self.v = None

    def reseed(self, seed: int) -> None:
        """Draw the next cold-start vector and refresh draws from `seed` (per client and round, so they are
        world-size independent)."""
        self._generator.manual_seed(seed)
        self._draws.manual_seed(seed ^ _REFRESH_STREAM)
        self._ahead = None

    def select_params(self, model: nn.Module) -> list[nn.Parameter]:
        params = [p for name, p in model.named_parameters() if p.requires_grad and self._predicate(name)]
        if not params:
            raise ValueError(f"FisherCurvature: param_filter {self.param_filter!r} selects no trainable parameter")
        return params

    def __call__(
        self,
        per_sample_losses: torch.Tensor,
        model_or_params: nn.Module | Sequence[torch.Tensor],
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, float]:
        """Returns (v^T F v as a differentiable loss term, the top eigenvalue as a float); with refresh k > 1, k v^T F v
        on the steps drawn (probability 1/k) and a zero with the last eigenvalue on the others."""
        due, self._ahead = self.due(), None
        if not due:
            self.last_iterations = 0
            return per_sample_losses.new_zeros(()), self.last_eigenvalue
        if isinstance(model_or_params, nn.Module):
            params = self.select_params(model_or_params)
        else:
            params = _check_params(model_or_params)
        if self.v is not None and [tuple(a.shape) for a in self.v] != [tuple(p.shape) for p in params]:
            self.v = None  # parameter set changed: the old direction means nothing here
        losses = _select_samples(per_sample_losses, mask)
        if losses.shape[0] == 0:
            self.last_eigenvalue, self.last_iterations = 0.0, 0
            return losses.sum() * 0.0, 0.0
        op = _FisherOperator(losses, params)
        held = self.direction == "held" and self.v is not None
        v = _initial_vector(params, self.v, self._generator)
        if held:
            term, fv = op.curvature_and_product(v)
            eig = float(_dot(v, fv))  # the Rayleigh quotient of the held vector: the term's value
            fv_norm = float(_norm(fv))
            self.v = [a / fv_norm for a in fv] if fv_norm > 0.0 else v
            self.last_eigenvalue, self.last_iterations = eig, 1
        else:
            eig, v, k = _power_iteration(op, v, self.iters, self.tol)
            self.v = v
            self.last_eigenvalue, self.last_iterations = eig, k
            term = op.curvature(v)
        return (term * self.refresh if self.refresh > 1 else term), eig
