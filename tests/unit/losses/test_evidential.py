"""Evidential Dirichlet / NIG losses against scipy closed forms, Monte-Carlo and numerical integration."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import integrate, stats
from scipy.special import digamma, gammaln

from resfl_lightning.losses.evidential import (
    annealing_coefficient,
    dirichlet_alpha,
    dirichlet_kl_uniform,
    dirichlet_nll,
    dirichlet_uncertainty,
    dirichlet_variance,
    expected_probability,
    group_balanced_mean,
    nig_epistemic_variance,
    nig_nll,
    nig_params,
    nig_regulariser,
)

torch.set_num_threads(1)
D = torch.float64


def _alphas(rows: int = 6, k: int = 4, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return dirichlet_alpha(3.0 * torch.randn(rows, k, generator=g, dtype=D))


def _kl_reference(a: np.ndarray) -> np.ndarray:
    """KL(Dir(a) || Dir(1)) from the general Dirichlet KL with b = 1, written with scipy."""
    b = np.ones_like(a)
    a0, b0 = a.sum(-1), b.sum(-1)
    return (
        gammaln(a0)
        - gammaln(a).sum(-1)
        - gammaln(b0)
        + gammaln(b).sum(-1)
        + ((a - b) * (digamma(a) - digamma(a0)[..., None])).sum(-1)
    )


def test_dirichlet_alpha_is_one_plus_softplus():
    z = torch.tensor([-30.0, -1.0, 0.0, 2.0, 40.0], dtype=D)
    np.testing.assert_allclose(dirichlet_alpha(z).numpy(), 1.0 + np.logaddexp(0.0, z.numpy()), rtol=1e-12)
    assert (dirichlet_alpha(z) >= 1.0).all()


def test_dirichlet_nll_one_hot_is_dirichlet_multinomial_nll():
    alpha = _alphas()
    labels = torch.tensor([0, 3, 1, 2, 2, 0])
    y = torch.nn.functional.one_hot(labels, 4).to(D)
    got = dirichlet_nll(alpha, y).numpy()
    ref = [-stats.dirichlet_multinomial.logpmf(y[i].numpy(), alpha[i].numpy(), 1) for i in range(len(labels))]
    np.testing.assert_allclose(got, ref, rtol=1e-10)


def test_dirichlet_nll_soft_targets_with_background_outcome():
    # One object class + background: y_bg = 1 - task-aligned score; the loss is linear in y.
    alpha = _alphas(rows=5, k=2, seed=3)
    score = torch.tensor([0.0, 0.2, 0.5, 0.9, 1.0], dtype=D)
    y = torch.stack([score, 1.0 - score], dim=1)
    got = dirichlet_nll(alpha, y).numpy()
    ref = []
    for i in range(5):
        a = alpha[i].numpy()
        ref.append(sum(y[i, c].item() * -stats.dirichlet_multinomial.logpmf(np.eye(2)[c], a, 1) for c in range(2)))
    np.testing.assert_allclose(got, ref, rtol=1e-10)
    with pytest.raises(ValueError, match="same shape"):
        dirichlet_nll(alpha, y[:, :1])


def test_dirichlet_kl_matches_closed_form_for_hard_and_soft_targets():
    alpha = _alphas(rows=8, k=3, seed=1)
    hard = torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]), 3).to(D)
    soft = torch.softmax(torch.randn(8, 3, generator=torch.Generator().manual_seed(5), dtype=D), dim=1)
    for y in (hard, soft):
        a_tilde = (y + (1 - y) * alpha).numpy()
        np.testing.assert_allclose(dirichlet_kl_uniform(alpha, y).numpy(), _kl_reference(a_tilde), rtol=1e-10)


def test_dirichlet_kl_zero_at_uniform_and_positive_otherwise():
    y = torch.nn.functional.one_hot(torch.tensor([1, 0]), 3).to(D)
    # Evidence only on the true class is removed by alpha~: nothing left to penalise.
    alpha_true_only = torch.tensor([[1.0, 9.0, 1.0], [50.0, 1.0, 1.0]], dtype=D)
    torch.testing.assert_close(dirichlet_kl_uniform(alpha_true_only, y), torch.zeros(2, dtype=D))
    torch.testing.assert_close(dirichlet_kl_uniform(torch.ones(2, 3, dtype=D), y), torch.zeros(2, dtype=D))
    alpha_wrong = torch.tensor([[1.5, 9.0, 1.0], [50.0, 1.0, 4.0]], dtype=D)
    assert (dirichlet_kl_uniform(alpha_wrong, y) > 1e-3).all()


def test_dirichlet_kl_has_no_gradient_on_true_class_evidence():
    logits = torch.randn(4, 3, dtype=D, requires_grad=True)
    y = torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 1]), 3).to(D)
    dirichlet_kl_uniform(dirichlet_alpha(logits), y).sum().backward()
    assert (logits.grad[y.bool()] == 0).all()
    assert (logits.grad[~y.bool()] != 0).all()


def test_dirichlet_kl_matches_monte_carlo():
    alpha = torch.tensor([[2.5, 7.0, 4.0]], dtype=D)
    y = torch.tensor([[0.0, 0.7, 0.0]], dtype=D)  # soft target: alpha~ = (2.5, 0.7 + 0.3 * 7, 4) = (2.5, 2.8, 4)
    a_tilde = (y + (1 - y) * alpha).numpy()[0]
    rng = np.random.default_rng(0)
    x = rng.dirichlet(a_tilde, size=200_000)
    mc = stats.dirichlet.logpdf(x.T, a_tilde).mean() - gammaln(3.0)  # log Dir(x; 1) = log Gamma(K)
    assert dirichlet_kl_uniform(alpha, y).item() == pytest.approx(mc, abs=0.01)


def test_annealing_coefficient():
    assert annealing_coefficient(0, 10) == 0.0
    assert annealing_coefficient(3, 10) == pytest.approx(0.3)
    assert annealing_coefficient(25, 10) == 1.0
    assert annealing_coefficient(5, 0) == 1.0
    with pytest.raises(ValueError):
        annealing_coefficient(-1, 10)


def test_dirichlet_moments_match_scipy():
    alpha = _alphas(rows=4, k=3, seed=2)
    for i in range(4):
        a = alpha[i].numpy()
        np.testing.assert_allclose(expected_probability(alpha)[i].numpy(), stats.dirichlet.mean(a), rtol=1e-12)
        np.testing.assert_allclose(dirichlet_variance(alpha)[i].numpy(), stats.dirichlet.var(a), rtol=1e-12)
        assert dirichlet_uncertainty(alpha)[i].item() == pytest.approx(1.0 / (a.sum() + 1.0), rel=1e-12)


def test_nig_params_constraints_and_values():
    raw = torch.tensor([[-40.0, -40.0, -40.0], [0.0, 1.0, 2.0], [30.0, -2.0, 5.0]], dtype=D)
    nu, alpha, beta = nig_params(raw)
    sp = np.logaddexp(0.0, raw.numpy())
    np.testing.assert_allclose(nu.numpy(), sp[:, 0] + 1e-6, rtol=1e-9)
    np.testing.assert_allclose(alpha.numpy(), 1.0 + sp[:, 1] + 1e-6, rtol=1e-9)
    np.testing.assert_allclose(beta.numpy(), sp[:, 2] + 1e-6, rtol=1e-9)
    assert (nu > 0).all() and (alpha > 1).all() and (beta > 0).all()
    with pytest.raises(ValueError, match="3"):
        nig_params(torch.zeros(2, 4))


def _nig_case():
    y = torch.tensor([0.3, -1.2, 5.0, 0.0, 2.2], dtype=D)
    gamma = torch.tensor([0.1, -1.0, 2.0, 0.0, -0.5], dtype=D)
    nu = torch.tensor([0.5, 2.0, 0.1, 10.0, 1.3], dtype=D)
    alpha = torch.tensor([1.5, 3.0, 1.1, 20.0, 2.2], dtype=D)
    beta = torch.tensor([0.4, 1.0, 2.0, 0.05, 3.0], dtype=D)
    return y, gamma, nu, alpha, beta


def test_nig_nll_is_student_t_marginal():
    y, gamma, nu, alpha, beta = _nig_case()
    scale = np.sqrt((beta * (1 + nu) / (nu * alpha)).numpy())
    ref = -stats.t.logpdf(y.numpy(), df=2 * alpha.numpy(), loc=gamma.numpy(), scale=scale)
    np.testing.assert_allclose(nig_nll(y, gamma, nu, alpha, beta).numpy(), ref, rtol=1e-10)


def test_nig_nll_matches_numerical_marginalisation():
    # y | sigma2 ~ N(gamma, sigma2 (1 + 1/nu)) after integrating mu; sigma2 ~ InvGamma(alpha, beta).
    y, gamma, nu, alpha, beta = (v[1].item() for v in _nig_case())

    def integrand(s2: float) -> float:
        return stats.norm.pdf(y, gamma, np.sqrt(s2 * (1 + 1 / nu))) * stats.invgamma.pdf(s2, alpha, scale=beta)

    lik, _ = integrate.quad(integrand, 0, np.inf)
    got = nig_nll(*(torch.tensor(v, dtype=D) for v in (y, gamma, nu, alpha, beta))).item()
    assert got == pytest.approx(-np.log(lik), rel=1e-6)


def test_nig_regulariser_and_epistemic_variance():
    y, gamma, nu, alpha, beta = _nig_case()
    expected = [
        abs(a - b) * (2 * n + al)
        for a, b, n, al in zip(y.tolist(), gamma.tolist(), nu.tolist(), alpha.tolist(), strict=True)
    ]
    np.testing.assert_allclose(nig_regulariser(y, gamma, nu, alpha).numpy(), expected, rtol=1e-12)
    assert nig_regulariser(gamma, gamma, nu, alpha).abs().max() == 0
    # Var[mu] = E[sigma2] / nu with sigma2 ~ InvGamma(alpha, beta).
    ref = stats.invgamma.mean(alpha.numpy(), scale=beta.numpy()) / nu.numpy()
    np.testing.assert_allclose(nig_epistemic_variance(nu, alpha, beta).numpy(), ref, rtol=1e-4)


def test_group_balanced_mean_weighs_groups_equally():
    values = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 10.0, 4.0, 100.0], dtype=D, requires_grad=True)
    groups = torch.tensor([0, 0, 0, 0, 0, 0, 1, 2, -1])
    got = group_balanced_mean(values, groups)
    assert got.item() == pytest.approx((1.0 + 10.0 + 4.0) / 3)
    df = pd.DataFrame({"v": values.detach().numpy(), "g": groups.numpy()})
    known = df[df.g >= 0]
    assert got.item() == pytest.approx(known.groupby("g").v.mean().mean())
    assert got.item() != pytest.approx(known.v.mean())  # the plain mean is dominated by group 0
    got.backward()
    np.testing.assert_allclose(values.grad.numpy(), [1 / 18] * 6 + [1 / 3, 1 / 3, 0.0])


def test_group_balanced_mean_without_known_groups_is_connected_zero():
    values = torch.tensor([2.0, float("inf")], requires_grad=True)
    out = group_balanced_mean(values, torch.tensor([-1, -1]))
    assert out.item() == 0.0 and out.requires_grad
    out.backward()
    assert values.grad.abs().sum() == 0
    with pytest.raises(ValueError, match="group labels"):
        group_balanced_mean(values, torch.tensor([0]))
