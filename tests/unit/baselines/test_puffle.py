"""`puffle` (the paper's prediction-level parity gap, fixed lambda) and `puffle_resfl` (the RESFL appendix's
feature-mean gap, bitwise the former `puffle`) on the clients."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from resfl_lightning.builders import algorithm_of, build_client
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.detection import DetectionClient
from resfl_lightning.clients.parity_term import ParityTerm
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.config import ConfigError
from resfl_lightning.losses.evidential import dirichlet_nll
from resfl_lightning.losses.fairness import group_mean_distance
from resfl_lightning.losses.parity import prediction_parity_gap
from resfl_lightning.models.yolo import YoloSpec
from resfl_lightning.privacy.dp import ClientDP
from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config, tiny_batch
from tests.unit.clients.test_tabular_client import NUM_FEATURES, NUM_GROUPS, toy_data

torch.set_num_threads(1)


def batch():
    return next(iter(toy_data(batch_size=32).train_loader(0, seed=0)))


def tabular(weights: LossWeights, lambda_parity: float = 0.0) -> TabularClient:
    """A tabular client; lambda_parity > 0 attaches PUFFLE's fixed-lambda parity term (as Algorithm.attach does)."""
    torch.manual_seed(0)
    client = TabularClient(NUM_FEATURES, NUM_GROUPS, weights, UfmSettings(), OptimSettings(), hidden=(16, 8))
    if lambda_parity > 0:
        client.add_plugin(ParityTerm(lambda_parity))
    client.begin_client(0, 0)
    return client


def test_lambda_zero_is_the_plain_task_loss_and_lambda_mixes_task_and_gap():
    b = batch()
    plain = tabular(LossWeights(lambda_priv=0.0, lambda_fair=0.0))
    loss0 = plain.training_step(b, 0)
    out = plain.model(b["x"])
    task = dirichlet_nll(out.alpha, F.one_hot(b["y"], 2).to(out.alpha.dtype)).mean()  # the task loss on its own
    assert torch.equal(loss0, task)
    lam = 0.3
    mixed = tabular(LossWeights(lambda_priv=0.0, lambda_fair=0.0), lambda_parity=lam)
    loss = mixed.training_step(b, 0)
    gap = prediction_parity_gap(out.logits, b["groups"])
    assert gap.item() > 0
    assert loss.item() == pytest.approx((1 - lam) * task.item() + lam * gap.item(), rel=1e-6)
    assert mixed.mean_losses()["parity"] == pytest.approx(gap.item(), rel=1e-6)
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in mixed.model.parameters()])
    assert torch.isfinite(grads).all() and grads.abs().sum() > 0


def test_puffle_resfl_is_bitwise_the_former_puffle():
    """The former `puffle` preset: fedavg's weights plus w_fair = 0.1 of the feature-mean gap, DP-SGD at C = 1,
    epsilon = 1, delta = 1e-6, PRV. Its loss on a fixed batch is task + 0.1 x group_mean_distance, bit for bit."""
    cfg = load_config(compose_config("algorithm=puffle_resfl", "dataset=adult", "logger=none"))
    algorithm = algorithm_of(cfg)
    assert algorithm.loss_weights() == LossWeights(lambda_priv=0.0, lambda_fair=0.0, lambda_curv=0.0, w_fair=0.1)
    assert (algorithm.dp.max_grad_norm, algorithm.dp.target_epsilon, algorithm.dp.target_delta,
            algorithm.dp.noise_multiplier, algorithm.dp.accountant) == (1.0, 1.0, 1e-6, None, "prv")
    assert cfg.aggregation._target_ == "resfl_lightning.aggregation.fedavg.FedAvg" and algorithm.table_order == 14
    b = batch()
    client = tabular(algorithm.loss_weights())
    loss = client.training_step(b, 0)
    out = client.model(b["x"])
    task = dirichlet_nll(out.alpha, F.one_hot(b["y"], 2).to(out.alpha.dtype)).mean()
    former = 1.0 * task + task * 0.0 + 0.0 * (task * 0.0)  # compose_loss' order: task, adv, unc (empty), then fair
    former = former + 0.1 * group_mean_distance(out.features, b["groups"])
    assert torch.equal(loss, former)


def test_puffle_preset_is_the_papers_regulariser_with_dp():
    cfg = load_config(compose_config("algorithm=puffle", "dataset=adult", "logger=none"))
    algorithm = algorithm_of(cfg)
    weights = algorithm.loss_weights()
    assert algorithm.lambda_parity == 0.5 and weights.w_fair == 0.0 and weights.lambda_priv == 0.0
    assert algorithm.per_sample_clipping and algorithm.dp.target_epsilon == 1.0


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_lambda_parity_outside_zero_one_names_the_key(value):
    with pytest.raises(ConfigError, match=r"algorithm\.lambda_parity"):
        load_config(compose_config("algorithm=puffle", f"algorithm.lambda_parity={value}", "logger=none"))


def test_detection_client_adds_the_person_level_gap():
    b = tiny_batch()
    losses, parts = {}, {}
    for lam in (0.0, 0.5):
        torch.manual_seed(0)
        client = DetectionClient(YoloSpec(num_classes=1, scale="femto", image_size=64), 3,
                                 LossWeights(lambda_priv=0.0, lambda_fair=0.0),
                                 UfmSettings(score_threshold=0.0, iou_threshold=0.0), OptimSettings())
        if lam > 0:
            client.add_plugin(ParityTerm(lam))
        client.begin_client(0, 0)
        losses[lam] = client.training_step(b, 0)
        parts[lam] = client.mean_losses()
    gap = parts[0.5]["parity"]
    # An untrained detector overlaps no person at IoU 0.5; at IoU 0 and tau 0 each person's score is the best of its
    # image: group 1's person (image 0) against group 2's two (image 1)
    assert gap > 0
    assert losses[0.5].item() == pytest.approx(0.5 * losses[0.0].item() + 0.5 * gap, rel=1e-5)
    losses[0.5].backward()
    grads = torch.cat([p.grad.reshape(-1) for p in client.model.parameters() if p.grad is not None])
    assert torch.isfinite(grads).all() and grads.abs().sum() > 0


def test_puffle_trains_under_dp_on_the_detection_factory():
    """The DP path: opacus' per-sample hooks take the coupled loss's backward (docs/method.md §5a's caveat)."""
    cfg = compose_config("algorithm=puffle", "model.scale=femto", "logger=none", "dataset.image_size=64")
    client = build_client(cfg, SimpleNamespace(num_groups=3, num_classes=1))
    assert client.plugin_of(ClientDP) is not None and client.plugin_of(ParityTerm).lambda_parity == 0.5
    client.begin_client(0, 0)
    loss = client.training_step(tiny_batch(), 0)
    assert torch.isfinite(loss)
