"""Fisher curvature (CurvFed L_curv) against an explicitly built empirical Fisher and numpy.linalg.eigvalsh."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from resfl_lightning.losses.curvature import (
    FisherCurvature,
    fisher_curvature_loss,
    fisher_power_iteration,
    fisher_top_eigenpair,
    fisher_vector_product,
)

torch.set_num_threads(1)
B = 16


def _model(batchnorm: bool = False, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = [nn.Linear(3, 4)] + ([nn.BatchNorm1d(4)] if batchnorm else []) + [nn.Tanh(), nn.Linear(4, 2)]
    return nn.Sequential(*layers).double().train()


def _data(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (B,), generator=g)


def _losses(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y, reduction="none")


def _per_sample_grads(losses: torch.Tensor, params: list[torch.Tensor]) -> np.ndarray:
    rows = []
    for i in range(losses.shape[0]):
        grads = torch.autograd.grad(losses[i], params, retain_graph=True)
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows).numpy()


def _explicit_fisher(losses: torch.Tensor, params: list[torch.Tensor]) -> np.ndarray:
    grads = _per_sample_grads(losses, params)
    return grads.T @ grads / grads.shape[0]


def _flat(v: list[torch.Tensor]) -> np.ndarray:
    return torch.cat([a.reshape(-1) for a in v]).numpy()


def test_fisher_vector_product_matches_explicit_fisher():
    model = _model()
    params = list(model.parameters())
    assert sum(p.numel() for p in params) == 26
    losses = _losses(model, *_data())
    fisher = _explicit_fisher(losses, params)
    v = [torch.randn_like(p) for p in params]
    np.testing.assert_allclose(
        _flat(fisher_vector_product(losses, params, v)), fisher @ _flat(v), rtol=1e-9, atol=1e-12
    )


@pytest.mark.parametrize("batchnorm", [False, True])
def test_top_eigenpair_matches_eigvalsh(batchnorm: bool):
    model = _model(batchnorm)
    params = list(model.parameters())
    losses = _losses(model, *_data())
    evals, evecs = np.linalg.eigh(_explicit_fisher(losses, params))
    eig, v = fisher_top_eigenpair(losses, params, iters=500, tol=1e-9, generator=torch.Generator().manual_seed(0))
    assert abs(eig - evals[-1]) / evals[-1] < 1e-3
    assert abs(_flat(v) @ evecs[:, -1]) > 0.999
    assert np.linalg.norm(_flat(v)) == pytest.approx(1.0)
    assert all(not a.requires_grad for a in v)


def test_few_iterations_are_not_enough_so_the_check_can_fail():
    model = _model()
    params = list(model.parameters())
    losses = _losses(model, *_data())
    top = np.linalg.eigvalsh(_explicit_fisher(losses, params))[-1]
    eig, _ = fisher_top_eigenpair(losses, params, iters=1, generator=torch.Generator().manual_seed(0))
    assert abs(eig - top) / top > 1e-3


def test_warm_start_converges_faster_on_next_step():
    model = _model()
    params = list(model.parameters())
    x, y = _data()
    losses = _losses(model, x, y)
    _, v1, _ = fisher_power_iteration(losses, params, iters=500, tol=1e-6, generator=torch.Generator().manual_seed(0))
    # Restarting from the converged vector on the same losses stops at once.
    assert fisher_power_iteration(losses, params, v0=v1, iters=500, tol=1e-6)[2] == 1
    opt = torch.optim.SGD(params, lr=0.01)
    opt.zero_grad()
    losses.mean().backward()
    opt.step()
    losses2 = _losses(model, x, y)
    top = np.linalg.eigvalsh(_explicit_fisher(losses2, params))[-1]
    eig_warm, _, n_warm = fisher_power_iteration(losses2, params, v0=v1, iters=500, tol=1e-6)
    assert abs(eig_warm - top) / top < 1e-3
    for seed in range(5):
        eig_cold, _, n_cold = fisher_power_iteration(
            losses2, params, iters=500, tol=1e-6, generator=torch.Generator().manual_seed(seed)
        )
        assert n_warm < n_cold
        assert abs(eig_cold - top) / top < 1e-3


@pytest.mark.parametrize("batchnorm", [False, True])
def test_curvature_loss_equals_eigenvalue_and_has_reference_gradient(batchnorm: bool):
    model = _model(batchnorm)
    params = list(model.parameters())
    losses = _losses(model, *_data())
    eig, v = fisher_top_eigenpair(losses, params, iters=500, tol=1e-9, generator=torch.Generator().manual_seed(0))
    curv = fisher_curvature_loss(losses, params, v)
    assert curv.item() == pytest.approx(eig, rel=1e-6)
    grads = torch.autograd.grad(curv, params, retain_graph=True)
    # Reference: (1/B) sum_i (g_i . v)^2 with every per-sample gradient built explicitly (create_graph).
    ref = 0.0
    for i in range(B):
        g_i = torch.autograd.grad(losses[i], params, retain_graph=True, create_graph=True)
        ref = ref + sum((a * b).sum() for a, b in zip(g_i, v, strict=True)) ** 2
    ref_grads = torch.autograd.grad(ref / B, params)
    for a, b in zip(grads, ref_grads, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)
    assert sum(a.abs().sum() for a in grads) > 1e-6


def test_curvature_loss_adds_to_training_loss():
    model = _model(batchnorm=True)
    params = list(model.parameters())
    losses = _losses(model, *_data())
    _, v = fisher_top_eigenpair(losses, params, iters=50)
    total = losses.mean() + 0.5 * fisher_curvature_loss(losses, params, v)
    total.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)


def test_mask_keeps_only_selected_samples():
    model = _model()
    params = list(model.parameters())
    losses = _losses(model, *_data())
    mask = torch.zeros(B, dtype=torch.bool)
    mask[[0, 2, 3, 7, 8, 11, 15]] = True
    grads = _per_sample_grads(losses, params)[mask.numpy()]
    top = np.linalg.eigvalsh(grads.T @ grads / grads.shape[0])[-1]
    full_top = np.linalg.eigvalsh(_explicit_fisher(losses, params))[-1]
    assert abs(top - full_top) / full_top > 1e-2
    eig, v = fisher_top_eigenpair(losses, params, iters=500, tol=1e-9, mask=mask)
    assert abs(eig - top) / top < 1e-3
    assert fisher_curvature_loss(losses, params, v, mask=mask).item() == pytest.approx(eig, rel=1e-6)


def test_mask_with_no_correct_sample_gives_connected_zero():
    model = _model()
    params = list(model.parameters())
    losses = _losses(model, *_data())
    none = torch.zeros(B, dtype=torch.bool)
    eig, v = fisher_top_eigenpair(losses, params, mask=none)
    assert eig == 0.0 and [a.shape for a in v] == [p.shape for p in params]
    curv = fisher_curvature_loss(losses, params, v, mask=none)
    assert curv.item() == 0.0 and curv.requires_grad
    term, eig2 = FisherCurvature(iters=5)(losses, model, mask=none)
    assert eig2 == 0.0 and term.item() == 0.0
    (curv + term).backward()
    with pytest.raises(ValueError, match="mask"):
        fisher_top_eigenpair(losses, params, mask=torch.ones(B - 1, dtype=torch.bool))


def test_unreached_parameter_has_zero_fisher_column():
    model = _model()
    unused = nn.Parameter(torch.randn(3, dtype=torch.float64))
    params = list(model.parameters())
    losses = _losses(model, *_data())
    top = np.linalg.eigvalsh(_explicit_fisher(losses, params))[-1]
    eig, v = fisher_top_eigenpair(losses, params + [unused], iters=500, tol=1e-9)
    assert abs(eig - top) / top < 1e-3
    assert v[-1].abs().max() < 1e-6


def test_fisher_curvature_helper_filters_params_and_warm_starts():
    model = _model()
    x, y = _data()
    helper = FisherCurvature(iters=300, param_filter="2.", tol=1e-6)  # last Linear only ("head")
    head = [model[2].weight, model[2].bias]
    assert helper.select_params(model) == head
    losses = _losses(model, x, y)
    top = np.linalg.eigvalsh(_explicit_fisher(losses, head))[-1]
    term, eig = helper(losses, model)
    assert abs(eig - top) / top < 1e-3 and term.item() == pytest.approx(eig, rel=1e-5)
    first_iters = helper.last_iterations
    term.backward()
    helper(_losses(model, x, y), model)  # same parameters: the kept vector is already converged
    assert helper.last_iterations == 1
    assert model[0].weight.grad is not None  # curvature of head parameters still trains the layers below
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    _, eig2 = helper(_losses(model, x, y), model)
    assert helper.last_iterations < first_iters
    # Parameter set changes shape: the warm-start vector is dropped instead of raising.
    other = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)).double()
    _, eig3 = helper(_losses(other, x, y), other)
    assert [tuple(a.shape) for a in helper.v] == [(2, 5), (2,)] and eig3 > 0
    with pytest.raises(ValueError, match="selects no"):
        FisherCurvature(param_filter="nope.").select_params(model)


def test_fisher_curvature_helper_predicate_and_all_params():
    model = _model(batchnorm=True)
    x, y = _data()
    losses = _losses(model, x, y)
    helper = FisherCurvature(iters=500, tol=1e-9, param_filter=lambda name: not name.startswith("1."))
    params = helper.select_params(model)
    assert len(params) == 4  # BatchNorm affine parameters excluded
    top = np.linalg.eigvalsh(_explicit_fisher(losses, params))[-1]
    _, eig = helper(losses, model)
    assert abs(eig - top) / top < 1e-3
    with pytest.raises(ValueError, match="iters"):
        FisherCurvature(iters=0)


def test_warm_start_normalises_with_one_norm_over_all_tensors(monkeypatch):
    """The warm-start vector is v0 / ||v0|| over all tensors, with the norm taken once (a norm per tensor made every
    step's warm start O(P^2) in the number of parameter tensors)."""
    import resfl_lightning.losses.curvature as curvature

    params = [torch.zeros(3, 2) for _ in range(40)]
    v0 = [torch.randn(3, 2, generator=torch.Generator().manual_seed(i)) for i in range(40)]
    calls = []
    norm = curvature._norm
    monkeypatch.setattr(curvature, "_norm", lambda a: calls.append(1) or norm(a))
    v = curvature._initial_vector(params, v0, None)
    total = torch.cat([a.reshape(-1) for a in v0]).norm()
    torch.testing.assert_close(torch.cat([a.reshape(-1) for a in v]), torch.cat([a.reshape(-1) for a in v0]) / total)
    assert len(calls) == 1


def _converged(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    _, v = fisher_top_eigenpair(_losses(model, x, y), list(model.parameters()), iters=500, tol=1e-10)
    return v


def test_refresh_one_is_the_term_of_every_step_and_draws_nothing():
    model, (x, y) = _model(), _data()
    params = list(model.parameters())
    every, plain = FisherCurvature(iters=2, seed=5), FisherCurvature(iters=2, seed=5, refresh=1)
    for _ in range(3):
        a, eig_a = every(_losses(model, x, y), params)
        b, eig_b = plain(_losses(model, x, y), params)
        assert a.item() == b.item() and eig_a == eig_b and a.item() > 0
    assert every._draws.get_state().equal(torch.Generator().manual_seed(5 ^ 0x43555256).get_state())


def test_refresh_k_is_the_same_loss_in_expectation_and_its_gradient_too():
    """k = 4 over 2,000 steps at a converged vector: the mean term and the mean gradient equal the every-step term's
    (within 4 standard errors), a share ~1/k of the steps computes it, each at k times its value."""
    model, (x, y), k, n = _model(), _data(), 4, 2000
    params = list(model.parameters())
    v = _converged(model, x, y)
    exact = fisher_curvature_loss(_losses(model, x, y), params, v)
    exact_grad = torch.autograd.grad(exact, params[0])[0]
    helper = FisherCurvature(iters=1, tol=1e-6, seed=3, refresh=k)
    values, grads = [], []
    for _ in range(n):
        helper.v = v
        term, _ = helper(_losses(model, x, y), params)
        values.append(term.item())
        grads.append(torch.autograd.grad(term, params[0], allow_unused=True)[0] if term.requires_grad
                     else torch.zeros_like(params[0]))
    values = np.asarray(values)
    computed = values[values != 0]
    assert abs(len(computed) / n - 1 / k) < 4 * np.sqrt((1 / k) * (1 - 1 / k) / n)
    np.testing.assert_allclose(computed, k * exact.item(), rtol=1e-6)
    assert abs(values.mean() - exact.item()) < 4 * values.std(ddof=1) / np.sqrt(n)
    g = torch.stack(grads).numpy()
    se = g.std(axis=0, ddof=1) / np.sqrt(n)
    assert (np.abs(g.mean(axis=0) - exact_grad.numpy()) <= 4 * se + 1e-12).all()


def test_refresh_draws_are_reproducible_from_the_client_seed_and_skip_the_power_iteration():
    model, (x, y) = _model(), _data()
    params = list(model.parameters())

    def pattern(seed: int) -> list[bool]:
        helper = FisherCurvature(iters=3, refresh=3)
        helper.reseed(seed)
        out = []
        for _ in range(30):
            term, _ = helper(_losses(model, x, y), params)
            out.append(term.item() != 0)
            if not out[-1]:
                assert helper.last_iterations == 0  # a skipped step runs no J v
        return out

    assert pattern(7) == pattern(7) != pattern(8)
    assert 0 < sum(pattern(7)) < 30
    with pytest.raises(ValueError, match="refresh must be >= 1"):
        FisherCurvature(refresh=0)


def test_a_decision_drawn_ahead_is_the_one_the_next_call_takes():
    model, (x, y) = _model(), _data()
    params = list(model.parameters())
    ahead, inline = FisherCurvature(iters=2, refresh=3, seed=4), FisherCurvature(iters=2, refresh=3, seed=4)
    for _ in range(20):
        due = ahead.due()
        assert ahead.due() == due  # drawn once per step
        a, _ = ahead(_losses(model, x, y), params)
        b, _ = inline(_losses(model, x, y), params)
        assert (a.item() != 0) == due and a.item() == b.item()


@pytest.mark.parametrize("batchnorm", [False, True])
def test_held_direction_converges_to_eigvalsh_over_steps_on_a_fixed_fisher(batchnorm: bool):
    """direction=held runs one power-iteration step a call: on a Fisher that does not move, its eigenvalue (the term's
    value) reaches the exact top eigenvalue of the explicit Fisher, and its vector the top eigenvector."""
    model, (x, y) = _model(batchnorm), _data()
    params = list(model.parameters())
    losses = _losses(model, x, y)
    fisher = _explicit_fisher(losses, params)
    evals, evecs = np.linalg.eigh(fisher)
    grads = _per_sample_grads(_losses(model, x, y), params)
    gram_top = np.linalg.eigvalsh(grads @ grads.T / B)[-1]  # the B x B Gram form: the same nonzero spectrum
    assert gram_top == pytest.approx(evals[-1], rel=1e-9)
    helper = FisherCurvature(iters=1, direction="held", seed=2)
    eigs = []
    for step in range(400):
        term, eig = helper(_losses(model, x, y), params)
        if step:  # after the cold start the eigenvalue reported is the term's value (the held vector's quotient)
            assert term.item() == pytest.approx(eig, rel=1e-9)
        eigs.append(eig)
    assert helper.last_iterations == 1
    assert abs(eigs[-1] - evals[-1]) / evals[-1] < 1e-6
    assert abs(abs(_flat(helper.v) @ evecs[:, -1]) - 1.0) < 1e-4
    assert eigs[0] < 0.9 * evals[-1]  # one iteration from a random start is not enough, so the check can fail


def test_held_direction_is_the_term_along_the_held_vector_and_moves_it_one_power_step():
    """The held term equals fisher_curvature_loss along the held vector, value and gradient; the next vector is
    F v / ||F v|| (the explicit Fisher's product)."""
    model, (x, y) = _model(batchnorm=True), _data()
    params = list(model.parameters())
    v = [torch.randn(p.shape, generator=torch.Generator().manual_seed(9), dtype=p.dtype) for p in params]
    norm = np.linalg.norm(_flat(v))
    v = [a / norm for a in v]
    helper = FisherCurvature(iters=5, direction="held")
    helper.v = v
    term, eig = helper(_losses(model, x, y), params)
    reference = fisher_curvature_loss(_losses(model, x, y), params, v)
    assert term.item() == pytest.approx(reference.item(), rel=1e-12) and eig == pytest.approx(term.item(), rel=1e-12)
    for a, b in zip(torch.autograd.grad(term, params), torch.autograd.grad(reference, params), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    fv = _explicit_fisher(_losses(model, x, y), params) @ _flat(v)
    np.testing.assert_allclose(_flat(helper.v), fv / np.linalg.norm(fv), rtol=1e-8, atol=1e-12)
    assert helper.last_iterations == 1


def test_held_direction_cold_starts_with_the_power_iteration():
    model, (x, y) = _model(), _data()
    params = list(model.parameters())
    held = FisherCurvature(iters=4, tol=0.0, seed=6, direction="held")
    converged = FisherCurvature(iters=4, tol=0.0, seed=6)
    a, eig_a = held(_losses(model, x, y), params)
    b, eig_b = converged(_losses(model, x, y), params)
    assert held.last_iterations == 4 and a.item() == b.item() and eig_a == eig_b
    held(_losses(model, x, y), params)
    assert held.last_iterations == 1
    with pytest.raises(ValueError, match="direction must be one of"):
        FisherCurvature(direction="fast")
