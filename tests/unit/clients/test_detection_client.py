"""Evidential YOLOv8 client: decoding, loss composition, group bookkeeping, learning signal."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.detection import DetectionClient
from resfl_lightning.models.yolo import YoloSpec
from tests.helpers import tiny_batch


def make_client(**weights) -> DetectionClient:
    torch.manual_seed(0)
    spec = YoloSpec(num_classes=1, scale="femto", image_size=64)
    return DetectionClient(spec, num_groups=3, weights=LossWeights(**weights), ufm=UfmSettings(),
                           optim=OptimSettings(lr=0.01))


def test_scores_are_expected_dirichlet_probabilities():
    client = make_client()
    client.eval()
    batch = tiny_batch()
    with torch.no_grad():
        out = client.model(batch["img"])
        n_anchors = out["scores"].shape[-1]
        preds = client.model.predict(out, conf=0.0, iou=1.01, max_det=n_anchors)
    alpha = 1 + F.softplus(out["scores"].permute(0, 2, 1))  # (B, A, 2): person, background
    for i, pred in enumerate(preds):
        expected = (alpha[i, :, 0] / alpha[i].sum(-1)).sort(descending=True).values
        torch.testing.assert_close(pred["scores"].sort(descending=True).values, expected)
        torch.testing.assert_close(pred["u_cls"], 1.0 / (pred["alpha0"] + 1.0))
        assert torch.all(pred["alpha0"] >= 2.0)  # two outcomes, each alpha >= 1
        assert pred["boxes"].min() >= 0 and pred["boxes"].max() <= 64


def test_training_step_composes_the_four_losses():
    client = make_client(lambda_priv=0.3, lambda_fair=0.2, lambda_curv=0.5, curv_iters=2)
    client.begin_client(0, round_idx=4)
    loss = client.training_step(tiny_batch(), 0)
    parts = client.mean_losses()
    # The adversary's CE enters unscaled: phi descends it, and the GRL (scale lambda_priv) reverses it into theta.
    assert client.adversary.grl_scale == pytest.approx(0.3)
    expected = parts["task"] + parts["adv"] + 0.2 * parts["unc"] + 0.5 * parts["curv"]
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert parts["task"] == pytest.approx(7.5 * parts["box"] + 0.5 * parts["cls"] + 1.5 * parts["dfl"]
                                          + parts["nig"], rel=1e-5)
    # curv and its eigenvalue are CurvFed's term over correctly detected images only (none in an untrained model's
    # tiny batch: 0; tests/unit/clients/test_curvfed_correct_samples.py tests them on correct ones)
    assert parts["adv"] > 0 and parts["unc"] > 0 and parts["curv"] >= 0 and parts["fim_eig"] >= 0
    loss.backward()
    adversary_grad = sum(p.grad.abs().sum() for p in client.adversary.parameters())
    assert math.isfinite(float(adversary_grad)) and adversary_grad > 0


def test_foreground_anchors_carry_the_group_of_their_person():
    client = make_client()
    batch = tiny_batch()
    res = client.criterion.compute(client.model(batch["img"]), batch)
    groups = res.fg_groups.tolist()
    assert groups and set(groups) <= {1, 2}
    # Anchors are laid out image by image: image 0 (group 1) first, then image 1 (group 2 only).
    assert groups == sorted(groups) and groups[0] == 1 and groups[-1] == 2
    assert res.fg_unc.shape == res.fg_groups.shape == res.fg_nig_reg.shape


def test_local_steps_reduce_the_task_loss():
    client = make_client(lambda_priv=0.0, lambda_fair=0.0)
    opt = client.configure_optimizers()
    batch = tiny_batch()
    first = None
    for _ in range(15):
        loss = client.training_step(batch, 0)
        first = float(loss) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(client.criterion.compute(client.model(batch["img"]), batch).task) < 0.7 * first


def test_validation_report_pieces_are_finite():
    client = make_client()
    loader = [tiny_batch(), tiny_batch()]
    result = client.evaluate(loader)
    assert 0.0 <= result.utility <= 1.0 and math.isfinite(result.eval_loss) and math.isfinite(result.ufm_raw)
    assert client.validation_fim(loader, iters=5) > 0
    metrics = client.test_metrics(loader)
    for key in ("map", "map_50", "delta_eop", "abs_one_minus_di", "ufm", "tpr/1", "tpr/2"):
        assert key in metrics


def test_criterion_follows_the_predictions_to_their_device(monkeypatch):
    """Fabric moves the client module to the GPU, not the criterion (a plain object whose constants ultralytics places
    at construction): on CUDA every client failed with "mat is on cuda:0, different from other tensors on cpu"."""
    client = make_client()
    crit = client.criterion
    seen = []
    follow = crit.follow
    monkeypatch.setattr(crit, "follow", lambda device: (seen.append(device), follow(device)))
    client.training_step(tiny_batch(), 0)
    assert seen and all(d == torch.device("cpu") for d in seen)  # compute() asks for the predictions' device
    assert crit.proj.device.type == "cpu"
    crit.follow(torch.device("meta"))
    assert crit.device == torch.device("meta") and crit.proj.device.type == "meta"
    assert all(t.device.type == "meta" for t in crit.bbox_loss.state_dict().values())
