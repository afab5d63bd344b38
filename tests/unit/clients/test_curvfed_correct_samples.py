"""CurvFed's curvature term (docs/method.md §5a): lambda_max of F_c = (1/n_c) sum_{i in C} g_i g_i^T over the
correctly classified samples C of the batch only, checked through the clients' training step against the
eigenvalues of the explicit Gram matrix of per-sample gradients; the detection client's per-image rule
(every person matched, images without persons left out)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.detection import DetectionClient, images_all_found
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.data.detection import ground_truth_for
from resfl_lightning.losses.evidential import dirichlet_nll
from resfl_lightning.models.yolo import YoloSpec
from tests.helpers import tiny_batch

torch.set_num_threads(1)
FEATURES, N = 4, 14


def _client() -> TabularClient:
    torch.manual_seed(0)
    weights = LossWeights(lambda_priv=0.0, lambda_fair=0.0, lambda_curv=0.92, lambda_task=0.08, curv_iters=500)
    client = TabularClient(FEATURES, 2, weights, UfmSettings(), OptimSettings(), hidden=(8,))
    return client.eval()  # BatchNorm on running statistics: a sample's loss does not depend on the others


def _curvature(client: TabularClient, x: torch.Tensor, y: torch.Tensor) -> float:
    client.curvature.reset()
    client.curvature.reseed(0)
    client.begin_client(0, 0)
    batch = {"x": x, "y": y, "groups": torch.zeros_like(y), "index": torch.arange(len(y))}
    client.training_step(batch, 0)
    return client.mean_losses()["curv"]


def _gram_lambda_max(client: TabularClient, x: torch.Tensor, y: torch.Tensor) -> float:
    """Independent reference: top eigenvalue of (1/n) G G^T, G the per-sample gradients of the Dirichlet NLL."""
    params = client.curvature_parameters()
    rows = []
    for i in range(len(y)):
        alpha = client.model(x[i: i + 1]).alpha
        loss = dirichlet_nll(alpha, F.one_hot(y[i: i + 1], 2).to(alpha.dtype)).sum()
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    g = torch.stack(rows).double()
    return float(torch.linalg.eigvalsh(g @ g.T / len(y))[-1])


def test_a_misclassified_sample_does_not_enter_the_curvature_term():
    client = _client()
    x = torch.randn(N, FEATURES, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        pred = client.model(x).alpha.argmax(-1)
    y = pred.clone()
    y[3] = 1 - y[3]  # sample 3 is misclassified, every other one correct
    keep = torch.arange(N) != 3
    with_wrong = _curvature(client, x, y)
    without = _curvature(client, x[keep], y[keep])
    assert abs(with_wrong - without) <= 1e-6 * without
    reference = _gram_lambda_max(client, x[keep], y[keep])
    assert abs(with_wrong - reference) <= 1e-3 * reference
    every_sample = _gram_lambda_max(client, x, y)  # what an all-sample Fisher would give
    assert abs(every_sample - reference) > 1e-2 * reference


def test_no_correct_sample_gives_a_zero_term():
    client = _client()
    x = torch.randn(6, FEATURES, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y = 1 - client.model(x).alpha.argmax(-1)
    assert _curvature(client, x, y) == 0.0


def test_detection_fisher_samples_are_the_images_whose_persons_are_all_found(monkeypatch):
    torch.manual_seed(0)
    weights = LossWeights(lambda_priv=0.0, lambda_fair=0.0, lambda_curv=0.92, lambda_task=0.08)
    client = DetectionClient(YoloSpec(scale="femto"), 3, weights, UfmSettings(), OptimSettings())
    batch = tiny_batch(64)  # image 0: one person; image 1: two persons
    batch["img"] = torch.cat([batch["img"], batch["img"][:1]])  # image 2: no person
    batch["image_id"] = torch.tensor([0, 1, 2])
    gts = ground_truth_for(batch)
    found = {"boxes": gts[1]["boxes"][:1], "scores": torch.tensor([0.9]), "labels": torch.tensor([0])}
    preds = [{"boxes": gts[0]["boxes"], "scores": torch.tensor([0.9]), "labels": torch.tensor([0])},
             found,  # image 1: one of its two persons
             {"boxes": gts[0]["boxes"], "scores": torch.tensor([0.9]), "labels": torch.tensor([0])}]
    assert images_all_found(preds, gts, 0.5, 0.25).tolist() == [True, False, False]
    low = [{**preds[0], "scores": torch.tensor([0.2])}]  # below the score threshold: not found
    assert images_all_found(low, gts[:1], 0.5, 0.25).tolist() == [False]

    monkeypatch.setattr(client.model, "predict", lambda out, **kw: preds)
    seen = {}

    def compose(task, adv, unc, groups, per_sample, parts, fair=None, terms=()):
        seen["per_sample"] = per_sample
        return task

    monkeypatch.setattr(client, "compose_loss", compose)
    client.training_step(batch, 0)
    out = client.model(batch["img"])
    every = client.criterion.compute(out, batch).per_image_cls
    torch.testing.assert_close(seen["per_sample"], every[:1])  # image 0's loss alone
