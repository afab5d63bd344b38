"""GPU readiness of the local step loop (docs/performance.md): the host synchronisations of a whole `local_train`,
counted at the dispatcher whoever makes them (our code, Lightning, torch.optim), must not grow with the number of
optimisation steps, except at the small allow-list below, each entry with the reason it stays. Syncs once per epoch or
round (the epoch's read-back of its device-side checks and clip norms) are what a loop may do.

Two kinds are counted: host reads (`.item()`, `float()` / `int()` / `bool()` / `if tensor`, all of which reach
`aten::_local_scalar_dense`, and `.tolist()`, `.cpu()`, `.numpy()`), and data-dependent shapes (boolean-mask indexing,
`nonzero`, `unique`, `masked_select`), which a GPU resolves by copying a count to the host and waiting for it.
"""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import callbacks
import resfl_lightning
from resfl_lightning.builders import algorithm_of, build_client
from resfl_lightning.federation.local import local_train
from resfl_lightning.run_config.load import load_config
from tests.federation_helpers import tiny_data
from tests.helpers import compose_config

HOST_READ, SHAPE = "host read", "data-dependent shape"
REPO = Path(resfl_lightning.__file__).resolve().parents[1]
PROJECT = tuple(str(Path(m.__file__).resolve().parent) + "/" for m in (resfl_lightning, callbacks))
SHAPE_OPS = {"nonzero", "nonzero_static", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive"}
MASKED_INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_"}

# The syncs that stay once per step, by kind and the project function they happen in (the backward pass: the local
# loop's function), each with why. An entry is allowed for the methods that name it and must be hit by them.
OPTIMIZER_STEP = (HOST_READ, "resfl_lightning/federation/local.py:train_epoch (torch.optim)")
UNC_GROUPS = (SHAPE, "resfl_lightning/losses/evidential.py:group_balanced_mean")
BACKWARD = (SHAPE, "resfl_lightning/federation/local.py:train_epoch")
ADVERSARY_ROWS = (SHAPE, "resfl_lightning/losses/adversary.py:adversarial_loss")
CURVATURE = {
    (HOST_READ, "resfl_lightning/losses/curvature.py:_power_iteration"):
        "power iteration's stop test (relative residual <= tol) and its zero-curvature exit decide how many "
        "iterations run, so the eigenvector and L_curv depend on them",
    (HOST_READ, "resfl_lightning/losses/curvature.py:_initial_vector"):
        "the warm-start vector is kept only when its norm is > 0 (else a fresh draw: the RNG stream depends on it)",
    (SHAPE, "resfl_lightning/clients/tabular.py:training_step"):
        "CurvFed's Fisher is taken over the correctly classified rows alone (docs/method.md §5a)",
    (SHAPE, "resfl_lightning/losses/curvature.py:__init__"): "the Fisher's double backward through that row mask",
    (SHAPE, "resfl_lightning/losses/curvature.py:jv"): "the Fisher's double backward through that row mask",
    (SHAPE, "resfl_lightning/losses/curvature.py:jtw"): "the Fisher's double backward through that row mask",
    (SHAPE, "resfl_lightning/losses/curvature.py:curvature_and_product"):
        "the Fisher's double backward through that row mask",
}
COMMON = {
    UNC_GROUPS: "L_unc is a mean over the groups present in the batch (torch.unique over the known-group rows); a "
                "fixed-size reduction over every group would reassociate the float sum and change the model's bits",
    BACKWARD: "the backward pass of the allowed boolean masks (index_put with the same mask)",
}
ALLOWED = {
    "fedavg": COMMON,
    "resfl": {
        **COMMON,
        OPTIMIZER_STEP: "phi's Adam reads its step counter (`_get_value`), which torch.optim keeps as a host tensor "
                        "unless capturable / fused: no device synchronisation",
        ADVERSARY_ROWS: "phi sees only the rows with a known group; its dropout draws one mask per row it sees, so "
                        "feeding every row (ignore_index) would change the RNG stream and the model",
    },
    "curvfed": {**COMMON, **CURVATURE},
}


def _site() -> str:
    """The innermost project function on the stack ('path.py:function', '(torch.optim)' when it called into it)."""
    frame, via_optim = sys._getframe(2), False
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(PROJECT):
            where = f"{Path(name).resolve().relative_to(REPO)}:{frame.f_code.co_name}"
            return where + (" (torch.optim)" if via_optim else "")
        via_optim = via_optim or "/torch/optim/" in name
        frame = frame.f_back
    return "<outside the project>"


class _SyncCounter(TorchDispatchMode):
    def __init__(self, counts: Counter) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == "_local_scalar_dense":
            self.counts[(HOST_READ, _site())] += 1
        elif name in SHAPE_OPS or (name in MASKED_INDEX_OPS and any(_is_mask(i) for i in args[1])):
            self.counts[(SHAPE, _site())] += 1
        return func(*args, **(kwargs or {}))


def _is_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


@contextmanager
def counting_syncs(monkeypatch):
    """Counts every host synchronisation inside the block by (kind, project function)."""
    counts: Counter = Counter()
    with monkeypatch.context() as patch:
        for method in ("tolist", "cpu", "numpy"):  # a CPU tensor's never reach the dispatcher
            original = getattr(torch.Tensor, method)

            def wrapped(self, *a, _original=original, **k):
                counts[(HOST_READ, _site())] += 1
                return _original(self, *a, **k)

            patch.setattr(torch.Tensor, method, wrapped)
        with _SyncCounter(counts):
            yield counts


def syncs_of_local_training(algorithm: str, steps: int, monkeypatch, precision: str = "32-true") -> Counter:
    """The host syncs of one client's `local_train` (one epoch of `steps` batches of tiny tabular rows) under the
    method's preset, as the orchestrator calls it."""
    cfg = load_config(compose_config(f"algorithm={algorithm}", "dataset=adult", "logger=none", "use_tuned=false",
                                     "model.hidden=[16]"))
    data = tiny_data(1, rows_per_client=8 * steps + 8)
    torch.manual_seed(0)
    client = build_client(cfg, data)
    client.import_local_state(None, seed=1)
    client.begin_client(0, 0)
    batches = [b for _, b in zip(range(steps), data.train_loader(0, seed=1))]
    assert len(batches) == steps
    fabric = L.Fabric(accelerator="cpu", devices=1, precision=precision)
    with counting_syncs(monkeypatch) as counts:
        done = local_train(fabric, client, lambda epoch: batches, epochs=1, sam_rho=algorithm_of(cfg).sam_rho)
    assert done == steps
    return counts


@pytest.mark.parametrize("algorithm", ["fedavg", "resfl", "curvfed"])
def test_host_syncs_do_not_grow_with_the_number_of_steps(algorithm, monkeypatch):
    few, many = (syncs_of_local_training(algorithm, n, monkeypatch) for n in (2, 5))
    grown = {site: many[site] - few[site] for site in many if many[site] > few[site]}
    allowed = ALLOWED[algorithm]
    assert {site: n for site, n in grown.items() if site not in allowed} == {}, "per-step host syncs"
    assert set(allowed) <= set(grown), f"allow-list entries no longer hit: {set(allowed) - set(grown)}"
    # Once per epoch: the read-back of the device-side checks and the clip norms.
    assert few[(HOST_READ, "resfl_lightning/federation/local.py:raise_failed_checks")] == 1
    assert few[(HOST_READ, "resfl_lightning/federation/local.py:train_epoch")] == 1


def test_the_counter_sees_every_kind_of_host_read(monkeypatch):
    """The counter itself: each read-back form and a boolean mask are counted at the function that made them."""
    x = torch.tensor([1.0, -2.0])
    with counting_syncs(monkeypatch) as counts:
        _ = x.sum().item(), float(x[0]), int(x[1]), bool(x[0] > 0), x.tolist(), x.cpu(), x.numpy(), x[x > 0]
        if x[0]:
            pass
    assert counts == Counter({(HOST_READ, "<outside the project>"): 8, (SHAPE, "<outside the project>"): 1})
