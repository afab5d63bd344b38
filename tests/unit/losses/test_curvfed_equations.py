"""CurvFed's local objective as the code implements it today (docs/method.md §5a, CurvFed), against an independent
closed form: a 2-parameter logistic regression p_i = sigmoid(w . x_i), per-sample loss l_i = BCE(p_i, y_i), whose
per-sample gradients are g_i = (p_i - y_i) x_i, empirical Fisher F = mean_i g_i g_i^T, lambda_max by
numpy.linalg.eigvalsh; the term's gradient is d(v^T F v)/dw = mean_i 2 c_i (x_i . v) p_i (1 - p_i) x_i with
c_i = g_i . v and v the top eigenvector held fixed.

These pin *our reading* (1 - a) mean_i l_i + a lambda_max(F over the correctly classified samples): the published
equation bodies (arXiv 2404.19725, Eq. 11) have not been read yet, so a change to that reading must change these
references deliberately."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from resfl_lightning.clients.base import FederatedClient, LossWeights
from resfl_lightning.losses.curvature import FisherCurvature, fisher_curvature_loss, fisher_top_eigenpair

torch.set_num_threads(1)

X = np.array([[1.0, 0.5], [-0.3, 2.0], [0.8, -1.2], [2.0, 0.1], [-1.5, -0.4], [0.2, 0.9]])
Y = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
W = np.array([0.7, -0.4])


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _reference(rows: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """Closed form on the selected rows: (F, lambda_max, top eigenvector, gradient of v^T F v in w)."""
    x, y = X[rows], Y[rows]
    p = _sigmoid(x @ W)
    g = (p - y)[:, None] * x
    fisher = g.T @ g / len(y)
    vals, vecs = np.linalg.eigh(fisher)
    v = vecs[:, -1]
    c = g @ v
    grad = (2.0 * c * (x @ v) * p * (1.0 - p))[:, None] * x
    return fisher, float(vals[-1]), v, grad.mean(axis=0)


def _torch_losses() -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.tensor(W, dtype=torch.float64, requires_grad=True)
    logits = torch.tensor(X) @ w
    losses = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor(Y), reduction="none")
    return w, losses


def test_closed_form_reference_is_what_eigvalsh_says():
    fisher, lam, v, _ = _reference(np.arange(len(Y)))
    assert lam == pytest.approx(float(np.linalg.eigvalsh(fisher)[-1]), rel=1e-12)
    assert fisher @ v == pytest.approx(lam * v, rel=1e-10)


def test_fisher_term_and_its_gradient_match_the_logistic_closed_form():
    w, losses = _torch_losses()
    _, lam, v_ref, grad_ref = _reference(np.arange(len(Y)))
    eig, v = fisher_top_eigenpair(losses, [w], iters=500, tol=0.0)
    assert eig == pytest.approx(lam, rel=1e-9)
    term = fisher_curvature_loss(losses, [w], v)
    assert float(term.detach()) == pytest.approx(lam, rel=1e-9)
    (grad,) = torch.autograd.grad(term, w)
    assert grad.numpy() == pytest.approx(grad_ref, rel=1e-7, abs=1e-12)
    assert abs(float(v[0] @ torch.tensor(v_ref))) == pytest.approx(1.0, rel=1e-9)


def test_fisher_is_taken_over_the_correctly_classified_rows_only():
    w, losses = _torch_losses()
    correct = (_sigmoid(X @ W) > 0.5) == (Y > 0.5)
    assert 0 < correct.sum() < len(Y)  # the case separates "correct rows" from "all rows"
    _, lam_correct, _, _ = _reference(np.flatnonzero(correct))
    _, lam_all, _, _ = _reference(np.arange(len(Y)))
    assert lam_correct != pytest.approx(lam_all, rel=1e-3)
    eig, _ = fisher_top_eigenpair(losses, [w], iters=500, tol=0.0, mask=torch.tensor(correct))
    assert eig == pytest.approx(lam_correct, rel=1e-9)


def test_curvfed_preset_combines_task_and_curvature_as_one_minus_a_and_a():
    from tests.helpers import compose_config

    alg = compose_config("algorithm=curvfed").algorithm
    a = float(alg.lambda_curv)
    assert float(alg.lambda_task) == pytest.approx(1.0 - a)
    weights = LossWeights(lambda_priv=0.0, lambda_fair=0.0, lambda_curv=a, lambda_task=float(alg.lambda_task))
    w, losses = _torch_losses()
    correct = (_sigmoid(X @ W) > 0.5) == (Y > 0.5)
    stub = SimpleNamespace(weights=weights, parity_lambda=None, curvature=FisherCurvature(iters=500, tol=0.0),
                           curvature_parameters=lambda: [w], _accumulate=lambda record: None)
    empty = torch.zeros(0, dtype=torch.float64)
    loss = FederatedClient.compose_loss(stub, losses.mean(), losses.sum() * 0.0, empty, empty.long(),
                                        losses[torch.tensor(correct)], {})
    p = _sigmoid(X @ W)
    task = float(np.mean(-(Y * np.log(p) + (1 - Y) * np.log(1 - p))))
    task_grad = ((p - Y)[:, None] * X).mean(axis=0)
    _, lam, _, curv_grad = _reference(np.flatnonzero(correct))
    assert float(loss.detach()) == pytest.approx((1 - a) * task + a * lam, rel=1e-9)
    (grad,) = torch.autograd.grad(loss, w)
    assert grad.numpy() == pytest.approx((1 - a) * task_grad + a * curv_grad, rel=1e-7, abs=1e-12)
