"""fabric.precision=bf16-mixed runs the local loop on a CPU (docs/performance.md, GPU readiness): every step under
bfloat16 autocast, finite losses, a changed model whose parameters stay float32, for FedAvg and RESFL (evidential head +
GRL adversary) on the tabular and the detection client, and CurvFed (Fisher power iteration, SAM) on the tabular one."""

from __future__ import annotations

import math
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from resfl_lightning.builders import algorithm_of, build_client
from resfl_lightning.federation.local import local_train
from resfl_lightning.run_config.load import load_config
from tests.federation_helpers import tiny_data
from tests.helpers import compose_config


def _train_bf16(cfg, data, loader_for_epoch) -> tuple[object, dict[str, torch.Tensor], set, int]:
    """(client, parameters before, the autocast states its training steps saw, steps) of one bf16-mixed epoch."""
    torch.manual_seed(0)
    client = build_client(cfg, data)
    client.import_local_state(None, seed=1)
    client.begin_client(0, 0)
    before = {n: p.detach().clone() for n, p in client.named_parameters()}
    seen = set()
    step = client.training_step

    def observed(batch, i):
        seen.add((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return step(batch, i)

    client.training_step = observed
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="bf16-mixed")
    steps = local_train(fabric, client, loader_for_epoch, epochs=1, sam_rho=algorithm_of(cfg).sam_rho)
    return client, before, seen, steps


def _check(client, before: dict[str, torch.Tensor], seen: set, steps: int, algorithm: str) -> None:
    assert steps > 0 and seen == {(True, torch.bfloat16)}
    means = client.mean_losses()
    assert means["total"] > 0 and all(math.isfinite(v) for v in means.values()), means
    params = dict(client.named_parameters())
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in params.values())
    theta = [n for n in params if not client.is_local_key(n)]
    assert any(not torch.equal(params[n], before[n]) for n in theta), "theta did not change"
    if algorithm == "resfl":  # phi trained too, and its CE entered the loss
        phi = [n for n in params if client.is_local_key(n)]
        assert phi and any(not torch.equal(params[n], before[n]) for n in phi) and means["adv"] > 0


@pytest.mark.parametrize("algorithm", ["fedavg", "resfl", "curvfed"])
def test_tabular_local_training_under_bf16_mixed_on_cpu(algorithm):
    cfg = load_config(compose_config(f"algorithm={algorithm}", "dataset=adult", "logger=none", "use_tuned=false",
                                     "model.hidden=[16]", "fabric.precision=bf16-mixed"))
    data = tiny_data(1, rows_per_client=48)
    client, before, seen, steps = _train_bf16(cfg, data, lambda epoch: data.train_loader(0, seed=1))
    _check(client, before, seen, steps, algorithm)


@pytest.mark.parametrize("algorithm", ["fedavg", "resfl"])
def test_detection_local_training_under_bf16_mixed_on_cpu(algorithm):
    from resfl_lightning.benchmarks.steps import synthetic_batch

    cfg = load_config(compose_config(f"algorithm={algorithm}", "logger=none", "use_tuned=false", "model.scale=femto",
                                     "dataset.image_size=64", "fabric.precision=bf16-mixed"))
    batch = synthetic_batch(64, 2)  # three groups (mst3), persons in both images
    data = SimpleNamespace(num_groups=3, num_classes=1)
    client, before, seen, steps = _train_bf16(cfg, data, lambda epoch: [batch, batch])
    _check(client, before, seen, steps, algorithm)
