"""GPU-ready step path (issue 11): no per-step host synchronisation in the local loop, a non-finite loss still named
by batch once per epoch, and DataLoader workers that change nothing but where batches are made."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from federation_helpers import client_factory, tiny_data

from resfl_lightning.clients import base
from resfl_lightning.data.federated import LoaderSettings
from resfl_lightning.federation import local
from resfl_lightning.federation.local import train_epoch

READBACKS = ("item", "tolist", "__float__", "__bool__", "__int__")


# The step path this issue owns: the local loop and the client base class's loss bookkeeping. (Batch validation
# in the clients and the adversary's group check still read back per step; see the follow-ups.)
OWNED = (str(Path(local.__file__)), str(Path(base.__file__)))


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


def _epoch(batches: int, monkeypatch, loss_scale: dict | None = None):
    data = tiny_data(1, rows_per_client=8 * batches + 8)
    client = client_factory()
    client.begin_client(0, 0)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    optimizer = fabric.setup_optimizers(client.configure_optimizers())
    locals_ = [fabric.setup_optimizers(o) for o in client.local_optimizers()]
    loader = [b for _, b in zip(range(batches), data.train_loader(0, seed=1))]
    if loss_scale:
        step = client.training_step
        client.training_step = lambda batch, i: step(batch, i) * loss_scale.get(i, 1.0)
    counter = _count_readbacks(monkeypatch)
    norms = train_epoch(fabric, client, optimizer, loader, 10.0, "client 0, round 0, epoch 0", locals_)
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
