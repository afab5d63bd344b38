"""GPU-ready step path: no per-step host synchronisation in the local loop, a non-finite loss still named
by batch once per epoch, and DataLoader workers that change nothing but where batches are made."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from resfl_lightning.clients import base, detection, tabular
from resfl_lightning.data.federated import LoaderSettings
from resfl_lightning.federation import local
from resfl_lightning.federation.local import sam_ascent, train_epoch
from resfl_lightning.losses import adversary
from tests.federation_helpers import client_factory, tiny_data

READBACKS = ("item", "tolist", "__float__", "__bool__", "__int__")


# The step path this issue owns: the local loop, the client base class's loss bookkeeping and input checks, the
# clients' training steps (label and group checks on the device) and the adversary's loss.
OWNED = tuple(str(Path(m.__file__)) for m in (local, base, tabular, detection, adversary))


def _count_readbacks(monkeypatch) -> list[int]:
    """Counts tensor -> Python read-backs (each one is a device synchronisation on a GPU) made by OWNED code."""
    counter = [0]
    for name in READBACKS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, _orig=original, **k):
            caller = sys._getframe(1).f_code.co_filename
            counter[0] += caller in OWNED
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    return counter


def _epoch(batches: int, monkeypatch, loss_scale: dict | None = None, edit: dict | None = None,
           sam_rho: float = 0.0, client=None, loader=None):
    """One train_epoch of `batches` tabular batches (or the given client and loader), counting OWNED read-backs.
    `edit` = {batch index: {key: (row, value)}} corrupts one value of those batches."""
    data = tiny_data(1, rows_per_client=8 * batches + 8)
    client = client or client_factory()
    client.begin_client(0, 0)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    optimizer = fabric.setup_optimizers(client.configure_optimizers())
    locals_ = [fabric.setup_optimizers(o) for o in client.local_optimizers()]
    loader = loader or [b for _, b in zip(range(batches), data.train_loader(0, seed=1))]
    for i, changes in (edit or {}).items():
        for key, (row, value) in changes.items():
            loader[i][key][row] = value
    if loss_scale:
        step = client.training_step
        client.training_step = lambda batch, i: step(batch, i) * loss_scale.get(i, 1.0)
    counter = _count_readbacks(monkeypatch)
    try:
        norms = train_epoch(fabric, client, optimizer, loader, 10.0, "client 0, round 0, epoch 0", locals_,
                            sam_rho=sam_rho)
    finally:
        monkeypatch.undo()
    return counter[0], norms, client


def test_read_backs_do_not_grow_with_the_number_of_steps(monkeypatch):
    few, norms_few, _ = _epoch(2, monkeypatch)
    many, norms_many, client = _epoch(6, monkeypatch)
    assert few == many <= 2  # one read-back of the epoch's loss check and one of its clip norms
    assert len(norms_many) == 6 and all(math.isfinite(n) and n > 0 for n in norms_many)
    means = client.mean_losses()  # the running sums stay on the device until asked for, then read once
    assert set(means) >= {"task", "total"} and all(math.isfinite(v) for v in means.values())


def test_a_non_finite_loss_is_named_by_its_batch_after_the_epoch(monkeypatch):
    with pytest.raises(FloatingPointError, match=r"client 0, round 0, epoch 0, batch 2: non-finite loss"):
        _epoch(5, monkeypatch, loss_scale={2: float("inf"), 4: float("nan")})


def test_sam_epochs_do_not_read_back_per_step(monkeypatch):
    few, _, _ = _epoch(2, monkeypatch, sam_rho=0.05)
    many, norms, _ = _epoch(6, monkeypatch, sam_rho=0.05)
    assert few == many <= 2 and len(norms) == 6 and all(math.isfinite(n) for n in norms)


@pytest.mark.parametrize("grad", [float("nan"), float("inf"), 0.0])
def test_sam_ascent_with_a_zero_or_non_finite_gradient_stays_at_theta(grad):
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    q = torch.nn.Parameter(torch.tensor([3.0]))  # a finite gradient beside the bad one: the norm is still unusable
    p.grad, q.grad = torch.tensor([grad, grad]), torch.tensor([0.0 if grad == 0.0 else 1.0])
    offsets = sam_ascent([p, q], rho=0.5)
    assert all(torch.equal(e, torch.zeros_like(e)) for e in offsets)
    assert torch.equal(p.detach(), torch.tensor([1.0, 2.0])) and torch.equal(q.detach(), torch.tensor([3.0]))


def test_an_out_of_range_label_is_named_by_client_and_batch_after_the_epoch(monkeypatch):
    with pytest.raises(ValueError, match=r"client 0, round 0, epoch 0, batch 1: tabular batch: labels must lie in "
                                         r"0\.\.1, got min, max: (0|-3), 7"):
        _epoch(4, monkeypatch, edit={1: {"y": (0, 7)}, 3: {"y": (0, -3)}})
    with pytest.raises(ValueError, match=r"batch 2: tabular batch: labels must lie in 0\.\.1, got min, max: -3, \d"):
        _epoch(4, monkeypatch, edit={2: {"y": (0, -3)}})


def test_an_out_of_range_group_is_named_by_client_and_batch_after_the_epoch(monkeypatch):
    with pytest.raises(ValueError, match=r"client 0, round 0, epoch 0, batch 3: group labels must lie in -1\.\.1 "
                                         r"\(-1 = unknown; the adversary has 2 groups\), got max: 5"):
        _epoch(5, monkeypatch, edit={3: {"groups": (1, 5)}, 4: {"groups": (0, 9)}})
    _epoch(3, monkeypatch, edit={1: {"groups": (0, -1)}})  # -1 is an unknown group, not an error


def test_a_bad_label_drops_the_client_with_a_warning_naming_it(tmp_path):
    from resfl_lightning.federation.faults import ClientDroppedWarning
    from tests.federation_helpers import run_federation

    data = tiny_data(3)
    data.y[int(data.splits.clients[1].train[0])] = 4
    with pytest.warns(ClientDroppedWarning, match=r"client 1, round 0: dropped.*ValueError: client 1, round 0, "
                                                  r"epoch 0, batch \d+: tabular batch: labels must lie in 0\.\.1"):
        _, _, rec = run_federation(tmp_path, num_clients=3, data=data)
    assert (rec.metrics[0]["client/1/dropped"], rec.metrics[0]["round/aggregated"]) == (1.0, 2.0)


def test_detection_steps_do_not_read_back_per_step(monkeypatch):
    """The detection client's own step code (strides, ROI batch indices, adversary groups) reads nothing back."""
    from resfl_lightning.benchmarks.steps import synthetic_batch
    from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
    from resfl_lightning.models.yolo import YoloSpec

    batch = synthetic_batch(64, 2)

    def run(steps):
        torch.manual_seed(0)
        client = detection.DetectionClient(YoloSpec(num_classes=1, scale="femto", image_size=64), 3, LossWeights(),
                                           UfmSettings(), OptimSettings(lr=0.01))
        return _epoch(steps, monkeypatch, client=client, loader=[batch] * steps)

    (few, _, _), (many, norms, _) = run(1), run(3)
    assert few == many <= 2 and len(norms) == 3


def test_loader_workers_give_the_same_batches():
    data = tiny_data(2)
    inline = [b["index"].tolist() for b in data.train_loader(1, seed=3)]
    data.loader = LoaderSettings(num_workers=2, persistent_workers=True, prefetch_factor=2)
    loader = data.train_loader(1, seed=3)
    assert loader.num_workers == 2 and loader.persistent_workers and loader.prefetch_factor == 2
    assert [b["index"].tolist() for b in loader] == inline


@pytest.mark.parametrize("kwargs", [dict(num_workers=-1), dict(persistent_workers=True),
                                    dict(prefetch_factor=2)])
def test_loader_settings_reject_inconsistent_values(kwargs):
    with pytest.raises(ValueError, match="dataset.loader"):
        LoaderSettings(**kwargs)
