"""TabularClient: loss composition (GRL sign, curvature mask), evaluate()/test_metrics() against fairlearn, scikit-learn
and a hand-written UFM, and the validation Fisher against an explicit per-sample-gradient Fisher."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fairlearn.metrics import (
    MetricFrame,
    demographic_parity_ratio,
    equal_opportunity_difference,
    false_positive_rate,
    selection_rate,
    true_positive_rate,
)
from sklearn.metrics import accuracy_score

from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.data.tabular import federated_tabular_data
from resfl_lightning.metrics.ufm import ufm_from_samples

torch.set_num_threads(1)
NUM_FEATURES, NUM_GROUPS = 6, 3


def toy_data(n_train: int = 480, n_test: int = 300, seed: int = 0, batch_size: int = 32):
    """Binary labels that depend on x and on the group, so predictions and group rates differ."""
    rng = np.random.default_rng(seed)

    def rows(n):
        x = rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)
        s = rng.integers(0, NUM_GROUPS, n)
        y = (x[:, 0] + 0.8 * (s - 1) + 0.5 * rng.normal(size=n) > 0).astype(np.int64)
        return x, y, s

    splits = {"num_clients": 2, "partition": "iid", "dirichlet_alpha": 0.5,
              "reserve_fraction": 0.05, "val_fraction": 0.2,
              "batch_size": batch_size, "eval_batch_size": 50}
    (xa, ya, sa), (xb, yb, sb) = rows(n_train), rows(n_test)
    return federated_tabular_data(xa, ya, sa, xb, yb, sb, num_groups=NUM_GROUPS, **splits, seed=seed)


def make_client(**weights) -> TabularClient:
    torch.manual_seed(0)
    return TabularClient(NUM_FEATURES, NUM_GROUPS, LossWeights(**weights), UfmSettings(), OptimSettings(lr=0.05),
                         hidden=(16, 8))


def train_steps(client: TabularClient, data, steps: int) -> None:
    """`steps` SGD steps on client 0, looping over epochs (the BN running statistics settle within ~30 steps)."""
    opt = client.configure_optimizers()
    client.train()
    done, epoch = 0, 0
    while done < steps:
        for batch in data.train_loader(0, seed=epoch):
            loss = client.training_step(batch, done)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                break
        epoch += 1


def flat(grads) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def test_loss_parts_are_recorded_and_finite():
    data = toy_data()
    client = make_client(lambda_priv=0.1, lambda_fair=0.01, lambda_curv=0.1)
    client.begin_client(0, round_idx=2)
    train_steps(client, data, steps=3)
    parts = client.mean_losses()
    assert {"task", "adv", "unc", "kl", "train_acc", "curv", "fim_eig", "total"} <= set(parts)
    assert all(math.isfinite(v) for v in parts.values())
    assert parts["adv"] > 0 and parts["unc"] > 0 and parts["fim_eig"] >= 0


def test_task_and_unc_terms_match_hand_computed_dirichlet_losses():
    data = toy_data()
    client = make_client(lambda_priv=0.0, lambda_fair=0.5, anneal_rounds=4)
    client.begin_client(0, round_idx=1)  # KL coefficient min(1, 2/4) = 0.5
    client.train()
    batch = next(iter(data.train_loader(0, seed=3)))
    loss = client.training_step(batch, 0)
    alpha = client.model(batch["x"]).alpha.detach().double()
    y, s = batch["y"], batch["groups"]
    a0 = alpha.sum(1)
    nll = torch.log(a0) - torch.log(alpha[torch.arange(len(y)), y])
    # KL(Dir(a~) || Dir(1)) for two classes, a~ = alpha with the true class's entry set to 1, via scipy.
    from scipy.special import digamma, gammaln

    at = alpha.clone().numpy()
    at[np.arange(len(y)), y.numpy()] = 1.0
    at0 = at.sum(1)
    kl = gammaln(at0) - gammaln(2) - gammaln(at).sum(1) + ((at - 1) * (digamma(at) - digamma(at0)[:, None])).sum(1)
    kl_groups = np.mean([kl[s.numpy() == g].mean() for g in np.unique(s.numpy())])
    expected = nll.mean().item() + 0.5 * 0.5 * kl_groups
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert client.mean_losses()["adv"] == 0.0


def test_grl_reverses_adversary_gradient_into_the_body():
    """d total / d body = d task / d body - lambda_priv * grl_scale * d CE / d body; the adversary descends CE."""
    data = toy_data()
    lp, scale = 0.5, 2.0
    client = make_client(lambda_priv=lp, lambda_fair=0.0, grl_scale=scale)
    client.begin_client(0, round_idx=0)
    client.train()
    client.adversary.eval()  # no dropout: the reference forward below sees the same adversary
    batch = next(iter(data.train_loader(0, seed=1)))
    body, adv = list(client.model.body.parameters()), list(client.adversary.parameters())
    loss = client.training_step(batch, 0)
    g_body, g_adv = flat(torch.autograd.grad(loss, body, retain_graph=True)), flat(torch.autograd.grad(loss, adv))

    out = client.model(batch["x"])  # train-mode BN uses the batch statistics again: identical forward
    task = -torch.log(out.alpha[torch.arange(len(batch["y"])), batch["y"]] / out.alpha.sum(1)).mean()
    ce = F.cross_entropy(client.adversary.mlp(out.features), batch["groups"])  # the adversary without the GRL
    g_task = flat(torch.autograd.grad(task, body, retain_graph=True))
    g_ce_body = flat(torch.autograd.grad(ce, body, retain_graph=True))
    g_ce_adv = flat(torch.autograd.grad(ce, adv))
    assert g_ce_body.norm() > 0
    assert torch.allclose(g_body, g_task - lp * scale * g_ce_body, atol=1e-6, rtol=1e-4)
    # phi descends its own CE unscaled (its own optimiser and lr); lambda_priv only scales the reversed gradient.
    assert torch.allclose(g_adv, g_ce_adv, atol=1e-7, rtol=1e-5)


def explicit_fisher_top(client: TabularClient, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor | None) -> float:
    """Top eigenvalue of (1/k) sum_i g_i g_i^T over the kept samples, per-sample head gradients one by one."""
    out = client.model(x)
    nll = torch.log(out.alpha.sum(1)) - torch.log(out.alpha[torch.arange(len(y)), y])
    keep = range(len(y)) if mask is None else torch.nonzero(mask).flatten().tolist()
    params = client.model.head_parameters
    rows = [flat(torch.autograd.grad(nll[i], params, retain_graph=True)).double().numpy() for i in keep]
    g = np.stack(rows)
    return float(np.linalg.eigvalsh(g.T @ g / len(rows))[-1])


def test_curvature_term_uses_the_correctly_classified_samples():
    data = toy_data()
    client = make_client(lambda_priv=0.0, lambda_fair=0.0, lambda_curv=1.0, curv_iters=300)
    client.curvature.tol = 1e-7
    client.begin_client(0, round_idx=0)
    client.train()
    batch = next(iter(data.train_loader(0, seed=2)))
    client.training_step(batch, 0)
    reported = client.mean_losses()["fim_eig"]
    with torch.no_grad():
        correct = client.model(batch["x"]).alpha.argmax(1) == batch["y"]
    assert 0 < int(correct.sum()) < len(correct)  # both kinds present, so the mask matters
    expected = explicit_fisher_top(client, batch["x"], batch["y"], correct)
    everyone = explicit_fisher_top(client, batch["x"], batch["y"], None)
    assert reported == pytest.approx(expected, rel=1e-3)
    assert abs(everyone - expected) > 1e-2 * expected


def test_validation_fim_matches_explicit_fisher_on_first_val_batch():
    data = toy_data()
    client = make_client(curv_params="head")
    train_steps(client, data, steps=2)  # running statistics away from their init
    loader = data.val_loader(0)
    eig = client.validation_fim(loader, iters=300)
    assert client.training  # mode restored
    client.eval()
    batch = next(iter(loader))
    assert eig == pytest.approx(explicit_fisher_top(client, batch["x"], batch["y"], None), rel=1e-3)


def test_evaluate_accuracy_loss_and_ufm_against_references():
    data = toy_data()
    client = make_client()
    train_steps(client, data, steps=40)
    loader = data.val_loader(1)
    result = client.evaluate(loader)
    assert client.training
    rows = torch.as_tensor(data.splits.clients[1].val)
    x, y, s = data.x[rows], data.y[rows].numpy(), data.groups[rows].numpy()
    client.eval()
    with torch.no_grad():
        logits = client.model(x).logits.double()
    alpha = 1.0 + F.softplus(logits)
    a0 = alpha.sum(1).numpy()
    # UFM by hand: inverse mean evidence per group, (max - min) / (mean + eps).
    inv = np.array([1.0 / a0[s == g].mean() for g in np.unique(s)])
    ufm = (inv.max() - inv.min()) / (inv.mean() + 1e-6)
    assert result.ufm_raw == pytest.approx(ufm, rel=1e-5)
    assert result.ufm_raw == pytest.approx(ufm_from_samples(a0, s).ufm, rel=1e-5)  # float32 outputs
    pred = logits.argmax(1).numpy()
    assert result.utility == pytest.approx(accuracy_score(y, pred)) and result.utility50 == result.utility
    nll = torch.log(alpha.sum(1)) - torch.log(alpha[torch.arange(len(y)), torch.as_tensor(y)])
    assert result.eval_loss == pytest.approx(nll.mean().item(), rel=1e-5)


def test_label_free_and_partial_label_ufm_cohorts():
    from sklearn.cluster import KMeans

    data = toy_data()
    client = make_client()
    train_steps(client, data, steps=40)
    client.begin_client(1, round_idx=2)
    loader = data.val_loader(1)
    pred = client.collect(loader)
    a0 = pred.alpha0.double().numpy()

    def ufm_of(cohorts: np.ndarray) -> float:
        inv = np.array([1.0 / a0[cohorts == c].mean() for c in np.unique(cohorts[cohorts >= 0])])
        return (inv.max() - inv.min()) / (inv.mean() + 1e-6)

    # Slices: 3 equal-size strata of vacuity 1/alpha0 by rank.
    client.ufm = UfmSettings(cohorts="slices", num_cohorts=3)
    strata = np.empty(len(a0), np.int64)
    strata[np.argsort(1.0 / a0, kind="stable")] = np.arange(len(a0)) * 3 // len(a0)
    assert client.evaluate(loader).ufm_raw == pytest.approx(ufm_of(strata), rel=1e-5)
    # Cluster: k-means on the L2-normalised penultimate features; every group label dropped falls back to it.
    client.ufm = UfmSettings(cohorts="cluster", num_cohorts=2)
    x = pred.features.double().numpy()
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    seed = 1 + 1000 * 2
    clusters = KMeans(n_clusters=2, random_state=seed, n_init=10).fit_predict(x)
    assert client.evaluate(loader).ufm_raw == pytest.approx(ufm_of(clusters), rel=1e-5)
    client.ufm = UfmSettings(cohorts="groups", drop_fraction=1.0, num_cohorts=2)
    assert client.evaluate(loader).ufm_raw == pytest.approx(ufm_of(clusters), rel=1e-5)
    # Partial labels: a fraction of the true groups is hidden (-1) before UFM.
    client.ufm = UfmSettings(drop_fraction=0.5)
    partial = client.ufm_cohorts(pred).numpy()
    known = partial >= 0
    assert known.sum() == len(a0) - round(0.5 * len(a0))
    np.testing.assert_array_equal(partial[known], pred.groups.numpy()[known])
    assert client.evaluate(loader).ufm_raw == pytest.approx(ufm_of(partial), rel=1e-5)
    client.ufm = UfmSettings(cohorts="proxy")
    with pytest.raises(ValueError, match="proxy"):
        client.evaluate(loader)


def test_test_metrics_match_fairlearn_on_the_same_predictions():
    data = toy_data(n_test=900)
    client = make_client()
    train_steps(client, data, steps=40)
    out = client.test_metrics(data.test_loader())
    rows = torch.as_tensor(data.splits.test)
    y, s = data.y[rows].numpy(), data.groups[rows].numpy()
    client.eval()
    with torch.no_grad():
        pred = client.model(data.x[rows]).logits.argmax(1).numpy()
    assert 0.05 < pred.mean() < 0.95  # a non-degenerate classifier, so the rates are informative
    assert out["accuracy"] == pytest.approx(accuracy_score(y, pred))
    mf = MetricFrame(metrics={"sr": selection_rate, "tpr": true_positive_rate, "fpr": false_positive_rate},
                     y_true=y, y_pred=pred, sensitive_features=s)
    for g in range(NUM_GROUPS):
        assert out[f"selection_rate/{g}"] == pytest.approx(mf.by_group.loc[g, "sr"])
        assert out[f"tpr/{g}"] == pytest.approx(mf.by_group.loc[g, "tpr"])
        assert out[f"fpr/{g}"] == pytest.approx(mf.by_group.loc[g, "fpr"])
    di = demographic_parity_ratio(y, pred, sensitive_features=s)
    assert out["abs_one_minus_di"] == pytest.approx(1 - di)
    assert out["delta_eop"] == pytest.approx(equal_opportunity_difference(y, pred, sensitive_features=s))
    assert out["eo_gap"] == pytest.approx(out["delta_eop"])  # max pairwise TPR gap = max - min
    assert {"ufm", "delta_u", "loss"} <= set(out) and all(f"mean_evidence/{g}" in out for g in range(NUM_GROUPS))


def test_training_improves_accuracy_on_a_learnable_problem():
    data = toy_data(n_train=1600, batch_size=64)
    client = make_client(lambda_priv=0.1, lambda_fair=0.01)
    before = client.evaluate(data.test_loader()).utility
    train_steps(client, data, steps=150)
    after = client.evaluate(data.test_loader()).utility
    # The group shifts y but is not a feature, so the Bayes accuracy from x alone is about 0.78.
    assert after > 0.7 and after > before + 0.1


def test_bad_batches_raise():
    client = make_client()
    batch = {"x": torch.randn(4, NUM_FEATURES), "y": torch.tensor([0, 1, 2, 0]), "groups": torch.zeros(4).long(),
             "index": torch.arange(4)}
    with pytest.raises(ValueError, match="labels"):  # evaluation checks on the host, at once
        client.collect([batch])
    # The training step checks the label range on the device (no host read per step): the local loop raises at the
    # epoch's end (tests/unit/clients/test_step_path.py); the step itself records the failing batch and never feeds
    # the bad label to one_hot.
    client.begin_client(0, 0)
    assert torch.isfinite(client.training_step(batch, 3))
    checks = {k: (int(c.first), c.detail.tolist()) for k, c in client.take_batch_checks().items()}
    assert checks["tabular batch: labels must lie in 0..1, got min, max"] == (3, [0, 2])
    assert [first for first, _ in checks.values()].count(-1) == len(checks) - 1  # the group check passed
    batch["y"] = torch.tensor([0, 1, 1])
    with pytest.raises(ValueError, match="batch dimension"):
        client.training_step(batch, 0)
