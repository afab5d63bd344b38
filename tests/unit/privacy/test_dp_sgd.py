"""FedAvg-DP / PUFFLE / PFU-FL's DP-SGD path: opacus' accountant, per-example clipping, GroupNorm, per-image loss."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from opacus.accountants import PRVAccountant
from opacus.accountants.utils import get_noise_multiplier
from opacus.optimizers import DPOptimizer
from opacus.validators import ModuleValidator

from resfl_lightning.builders import build_client
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.federation.local import local_train
from resfl_lightning.losses.evidential import dirichlet_nll
from resfl_lightning.losses.per_image import image_slice, image_targets, per_image_detection_loss
from resfl_lightning.models.tabular import TabularNet
from resfl_lightning.models.yolo import EvidentialYOLO, YoloSpec
from resfl_lightning.privacy import bookkeeping
from resfl_lightning.privacy.dp import (
    ClientDP,
    ClientDPOptimizer,
    DPSettings,
    noise_multiplier_for,
    planned_steps,
    prepare_model,
    sample_rate,
)
from tests.helpers import compose_config, tiny_batch
from tests.unit.clients.test_tabular_client import NUM_FEATURES, NUM_GROUPS, toy_data

torch.set_num_threads(1)


def dp_tabular_client(settings: DPSettings, lr: float = 0.05) -> TabularClient:
    torch.manual_seed(0)
    client = TabularClient(NUM_FEATURES, NUM_GROUPS, LossWeights(lambda_priv=0.0, lambda_fair=0.0),
                           UfmSettings(gate=None), OptimSettings(lr=lr, momentum=0.0, weight_decay=0.0,
                                                                 grad_clip=None), hidden=(16, 8))
    client.model = prepare_model(client.model)
    client.add_plugin(ClientDP(settings, client.model))
    return client


def dp_of(client) -> ClientDP | None:
    """The client's DP-SGD plug-in (None: trained without DP-SGD)."""
    return client.plugin_of(ClientDP)


def count(model, kind) -> int:
    return sum(isinstance(m, kind) for m in model.modules())


@pytest.mark.parametrize("make", [lambda: TabularNet(NUM_FEATURES, (16, 8)),
                                  lambda: EvidentialYOLO(YoloSpec(scale="femto", image_size=64))])
def test_batchnorm_becomes_groupnorm_and_opacus_validator_passes(make):
    model = make()
    n_bn = count(model, torch.nn.modules.batchnorm._BatchNorm)
    assert n_bn > 0 and ModuleValidator.validate(model, strict=False)
    fixed = prepare_model(model)
    assert count(fixed, torch.nn.modules.batchnorm._BatchNorm) == 0
    assert count(fixed, torch.nn.GroupNorm) == n_bn
    assert ModuleValidator.validate(fixed, strict=False) == []


def test_dp_config_builds_the_global_model_with_groupnorm():
    """The factory every client and the server's layout come from applies the fix (one flat layout for all)."""
    cfg = compose_config("algorithm=fedavg_dp", "model.scale=femto", "logger=none")
    client = build_client(cfg, SimpleNamespace(num_groups=3, num_classes=1))
    assert dp_of(client) is not None
    assert count(client, torch.nn.modules.batchnorm._BatchNorm) == 0
    assert ModuleValidator.validate(client.model, strict=False) == []
    plain = build_client(compose_config("algorithm=fedavg", "model.scale=femto", "logger=none"),
                         SimpleNamespace(num_groups=3, num_classes=1))
    assert dp_of(plain) is None and count(plain, torch.nn.modules.batchnorm._BatchNorm) > 0


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_noise_multiplier_equals_opacus_prv_for_the_whole_run(epsilon):
    settings = DPSettings(target_epsilon=epsilon, rounds=3, local_epochs=2)
    q = sample_rate(200, 20)
    expected = get_noise_multiplier(target_epsilon=epsilon, target_delta=1e-6, sample_rate=0.1, steps=3 * 2 * 10,
                                    accountant="prv")
    assert planned_steps(settings, q) == 60
    assert noise_multiplier_for(settings, q) == pytest.approx(expected, rel=1e-12)


def test_spent_epsilon_equals_opacus_accountant_and_survives_resume():
    """Two rounds of real local training, the client state carried through export/import into a fresh module
    (as the ClientStateStore does on resume): the spent epsilon is opacus' PRV epsilon of the steps taken."""
    data = toy_data(batch_size=16)
    settings = DPSettings(target_epsilon=1.0, rounds=2, local_epochs=2)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    state, steps = None, 0
    for round_idx in range(2):
        client = dp_tabular_client(settings)
        client.import_local_state(state, seed=0)
        steps += local_train(fabric, client, lambda e, r=round_idx: data.train_loader(0, seed=10 * r + e), epochs=2)
        state = client.export_local_state()
        if round_idx == 0:
            half = dp_of(client).epsilon()
    q = sample_rate(data.num_train(0), 16)
    sigma = noise_multiplier_for(settings, q)
    assert steps == planned_steps(settings, q)
    reference = PRVAccountant()
    reference.history = [(sigma, q, steps)]
    spent = dp_of(client).epsilon()
    assert spent == pytest.approx(reference.get_epsilon(delta=1e-6), rel=1e-9)
    assert 0.95 <= spent <= 1.0 + 1e-9  # the target is reached after the planned steps, not exceeded
    assert 0 < half < spent


def test_empty_poisson_batch_takes_a_counted_noise_only_step():
    client = dp_tabular_client(DPSettings(target_epsilon=None, noise_multiplier=1.0))
    data = toy_data(batch_size=16)
    optimizer = client.configure_optimizers()
    dp_of(client).loader(data.train_loader(0, seed=0))
    before = [p.detach().clone() for p in client.model.parameters()]
    dp_of(client).noise_only_step(optimizer)
    assert any(not torch.equal(a, p) for a, p in zip(before, client.model.parameters()))
    assert dp_of(client).accountant.history == [(1.0, dp_of(client).q, 1)]


def per_example_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Independent reference: one forward/backward per example on a hook-free copy of the model."""
    out = []
    params = list(model.parameters())
    for i in range(x.shape[0]):
        alpha = model(x[i:i + 1]).alpha
        loss = dirichlet_nll(alpha, F.one_hot(y[i:i + 1], 2).to(alpha.dtype)).mean()
        out.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    return out



def clipped_step_setup(clip: float, noise_multiplier: float, clipping: str = "bookkeeping"):
    """A DP client (plain SGD at lr 1, clip C), its optimizer, one batch, and that batch's per-example gradients from
    a separate hook-free copy of the model (the independent reference both DP-SGD step tests compare with)."""
    client = dp_tabular_client(DPSettings(target_epsilon=None, noise_multiplier=noise_multiplier, max_grad_norm=clip,
                                          clipping=clipping), lr=1.0)
    reference = prepare_model(TabularNet(NUM_FEATURES, (16, 8)))
    reference.load_state_dict(client.model.state_dict())
    data = toy_data(batch_size=16)
    optimizer = client.configure_optimizers()
    dp_of(client).loader(data.train_loader(0, seed=0))
    batch = next(iter(data.train_loader(0, seed=1)))
    return client, optimizer, batch, per_example_grads(reference, batch["x"], batch["y"])

@pytest.mark.parametrize("clipping", ["bookkeeping", "per_sample"])
def test_dp_step_is_the_mean_of_independently_clipped_per_example_gradients(clipping):
    """With no noise and plain SGD at lr 1, the DP step equals -(sum_i clip_C(g_i)) / E[B], where g_i comes from a
    separate hook-free model; every clipped g_i has norm <= C and some were clipped. Book-keeping's placeholders
    stand for the same per-example gradients (materialised here only to compare)."""
    clip = 0.05
    client, optimizer, batch, grads = clipped_step_setup(clip, noise_multiplier=0.0, clipping=clipping)
    norms = torch.stack([g.norm() for g in grads])
    clipped = [g * min(1.0, clip / (float(g.norm()) + 1e-6)) for g in grads]
    assert (norms > clip).any()
    assert max(float(g.norm()) for g in clipped) <= clip + 1e-7
    before = torch.cat([p.detach().reshape(-1).clone() for p in client.model.parameters()])
    client.train()
    loss = client.training_step(batch, 0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    samples = [bookkeeping.dense(p.grad_sample) for p in client.model.parameters()]
    assert any(bookkeeping.is_factored(p.grad_sample) for p in client.model.parameters()) == (clipping == "bookkeeping")
    hooks = torch.cat([s.reshape(len(grads), -1) for s in samples], dim=1)
    torch.testing.assert_close(hooks, torch.stack(grads), rtol=1e-4, atol=1e-6)
    optimizer.step()
    after = torch.cat([p.detach().reshape(-1) for p in client.model.parameters()])
    expected = -torch.stack(clipped).sum(0) / optimizer.expected_batch_size
    torch.testing.assert_close(after - before, expected, rtol=1e-4, atol=1e-7)


def test_per_image_detection_loss_is_the_batch_loss_for_one_image_and_decouples_images():
    torch.manual_seed(0)
    cfg = compose_config("algorithm=fedavg_dp", "model.scale=femto", "logger=none", "dataset.image_size=64")
    client = build_client(cfg, SimpleNamespace(num_groups=3, num_classes=1))
    batch = tiny_batch(64)
    one = image_targets(batch, 1)
    dp_of(client).set_training(False)  # a forward without backward must not leave activations to the hooks
    out = client.model(one["img"])
    torch.testing.assert_close(per_image_detection_loss(client.criterion, out, one).task,
                               client.criterion.compute(out, one).task)
    # Two images: each image's per-sample gradient (opacus hooks) equals that image's loss gradient alone.
    params = [p for p in client.model.parameters() if p.requires_grad]
    for p in params:
        p.grad_sample = None
    client.train()  # hooks on again
    res = per_image_detection_loss(client.criterion, client.model(batch["img"]), batch)
    res.task.backward()
    hooks = torch.cat([p.grad_sample.reshape(2, -1) for p in params], dim=1)
    # ultralytics' batch-normalised loss, for contrast: its per-sample gradients are not the images' own.
    for p in params:
        p.grad_sample = None
    client.criterion.compute(client.model(batch["img"]), batch).task.backward()
    coupled = torch.cat([p.grad_sample.reshape(2, -1) for p in params], dim=1)
    dp_of(client).set_training(False)
    for i in range(2):
        own = image_targets(batch, i)
        task = client.criterion.compute(image_slice(client.model(own["img"]), 0), own).task
        ref = torch.cat([g.reshape(-1) for g in torch.autograd.grad(task, params)])
        assert float((hooks[i] - ref).norm() / ref.norm()) < 1e-3  # float32 through a deep conv net
        assert float((coupled[i] - ref).norm() / ref.norm()) > 0.05


def _noisy_dp_step(optimizer_class) -> list[torch.Tensor]:
    """The parameters after one noisy DP-SGD step (seeded noise) of a small GradSampleModule model."""
    from opacus import GradSampleModule

    torch.manual_seed(0)
    model = GradSampleModule(prepare_model(TabularNet(NUM_FEATURES, (16, 8))), loss_reduction="mean")
    batch = next(iter(toy_data(batch_size=16).train_loader(0, seed=1)))
    optimizer = optimizer_class(torch.optim.SGD(model.parameters(), lr=0.5), noise_multiplier=1.3,
                                max_grad_norm=0.1, expected_batch_size=16, loss_reduction="mean",
                                generator=torch.Generator().manual_seed(7))
    F.cross_entropy(model(batch["x"]).logits, batch["y"].long()).backward()
    optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_client_dp_optimizer_step_is_opacus_step_with_one_divisor_read(monkeypatch):
    """ClientDPOptimizer takes exactly opacus' noisy step (same noise stream: bitwise-equal parameters) while
    reading accumulated_iterations (a pass over every parameter) once per step, not once per parameter."""
    reads = []
    original = DPOptimizer.accumulated_iterations
    monkeypatch.setattr(DPOptimizer, "accumulated_iterations",
                        property(lambda self: reads.append(1) or original.fget(self)))
    after_ours = _noisy_dp_step(ClientDPOptimizer)
    ours, reads[:] = len(reads), []
    after_theirs = _noisy_dp_step(DPOptimizer)
    for a, b in zip(after_ours, after_theirs, strict=True):
        assert torch.equal(a, b)
    assert ours == 1 and len(reads) == len(after_ours) > 1


def test_batched_per_image_loss_equals_the_image_by_image_definition():
    """One batched pass gives every field of the image-by-image loss (the criterion on each image alone, then the
    mean), on images with many, few and no persons, and the same gradient."""
    from resfl_lightning.benchmarks.steps import synthetic_batch
    from resfl_lightning.losses.per_image import per_image_loss_loop

    torch.manual_seed(0)
    cfg = compose_config("algorithm=fedavg_dp", "model.scale=femto", "logger=none", "dataset.image_size=64")
    client = build_client(cfg, SimpleNamespace(num_groups=3, num_classes=1))
    dp_of(client).set_training(False)
    batch = synthetic_batch(64, 5)
    keep = batch["batch_idx"] != 2  # image 2 has no box at all
    batch = {k: (v[keep] if k in ("cls", "bboxes", "groups", "batch_idx", "proxy") else v) for k, v in batch.items()}
    counts = torch.bincount(batch["batch_idx"].long(), minlength=5)
    assert counts[2] == 0 and counts.max() > counts[counts > 0].min()
    params = [p for p in client.model.parameters() if p.requires_grad]
    results = []
    for loss in (per_image_detection_loss, per_image_loss_loop):
        res = loss(client.criterion, client.model(batch["img"]), batch)
        grad = torch.cat([g.reshape(-1) for g in torch.autograd.grad(res.task, params)])
        results.append((res, grad))
    (fast, g_fast), (loop, g_loop) = results
    torch.testing.assert_close(fast.task, loop.task)
    for k in loop.parts:
        torch.testing.assert_close(fast.parts[k], loop.parts[k])
    for field in ("per_image_cls", "fg_unc", "fg_nig_reg", "fg_groups"):
        torch.testing.assert_close(getattr(fast, field), getattr(loop, field))
    assert float((g_fast - g_loop).norm() / g_loop.norm()) < 1e-4
    # Not the batch-normalised loss: images with more persons would weigh more there.
    assert abs(float(client.criterion.compute(client.model(batch["img"]), batch).task - loop.task)) > 1e-3
