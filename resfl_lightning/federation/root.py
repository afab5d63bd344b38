"""The server's root split (FLTrust, resfl_robust; docs/method.md §10, docs/method.md "Threat model of resfl_robust").

A small labelled set the server holds, carved at the start of the run from the attack reserve (seeded): the carved
items leave `splits.reserve`, so the MIA / AIA sets drawn from the reserve afterwards stay disjoint from it, and the
reserve is already disjoint from every client's train/val split and from the test split. On it the server
- trains the round's root update g_0 = theta' - theta_G with the clients' own recipe (local epochs, lr schedule,
  losses), starting from theta_G with a fresh client state seeded from (run seed, round); each local epoch is one
  pass over the root split, or, with `batches_per_epoch` set (FLTrust's root_steps=matched), that many batches of
  reshuffled passes, so that g_0 takes as many steps as a client;
- evaluates theta_G + delta_i of any update (utility, UFM and its bootstrap SE), as a client evaluates its own.
Every rank computes the same values from the same seed (no collective). Cost per round: one local training on the
root split, plus one evaluation per update for the rules that ask for them. A rule asks for it in its `attach`
(Federation.server_root), so the rules never import the training loop.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import torch

from resfl_lightning.clients.identity import as_server
from resfl_lightning.data.federated import base_data
from resfl_lightning.digest import state_sha256
from resfl_lightning.env import seed_all
from resfl_lightning.federation.local import local_train

_ROOT_STREAM = 0x524F4F54  # separates the root split's draws from other uses of the run seed


def root_indices(reserve: np.ndarray, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(root items, the rest of the reserve): `size` items drawn without replacement from the reserve, seeded."""
    reserve = np.asarray(reserve, dtype=np.int64)
    if not 1 <= size <= len(reserve):
        raise ValueError(f"aggregation.root_size={size}: the attack reserve holds {len(reserve)} items; choose "
                         f"1..{len(reserve)} or raise dataset.reserve_fraction")
    rng = np.random.default_rng([seed, _ROOT_STREAM])
    chosen = np.zeros(len(reserve), dtype=bool)
    chosen[rng.choice(len(reserve), size=size, replace=False)] = True
    return np.sort(reserve[chosen]), np.sort(reserve[~chosen])


class RootPasses:
    """One local epoch of `batches` root-split batches: reshuffled passes one after another, pass j drawn from seed
    first + j, cut at `batches` (a sized iterable, as a client's loader is)."""

    def __init__(self, loader_for_seed: Callable[[int], object], first: int, batches: int):
        self.loader_for_seed, self.first, self.batches = loader_for_seed, first, batches

    def __len__(self) -> int:
        return self.batches

    def __iter__(self) -> Iterator:
        left, j = self.batches, 0
        while left > 0:
            before = left
            for batch in self.loader_for_seed(self.first + j):
                yield batch
                left -= 1
                if left == 0:
                    return
            if left == before:
                raise ValueError("aggregation.root_steps=matched: the root split gives no training batch; raise "
                                 "aggregation.root_size")
            j += 1


class ServerRoot:
    """Root split + the live client module, used by the server between local training and aggregation (FLTrust,
    resfl_robust: resfl_lightning/aggregation/)."""

    def __init__(self, federation, model, layout, size: int):
        data = base_data(federation.data)
        n_reserve = len(data.splits.reserve)
        if size > n_reserve // 2:  # the privacy attacks keep at least half the reserve other methods get in full
            warnings.warn(f"aggregation.root_size={size} capped at {n_reserve // 2}, half the attack reserve of "
                          f"{n_reserve} items (MIA / AIA of this run use the other half; methods without a root split "
                          "use all of it): raise dataset.reserve_fraction for a larger root split",
                          RuntimeWarning, stacklevel=2)
            size = n_reserve // 2
        self.indices, rest = root_indices(data.splits.reserve, size, federation.settings.seed)
        data.splits = dataclasses.replace(data.splits, reserve=rest)  # carve: later reserve users never see it
        self.data, self.fabric, self.settings = data, federation.fabric, federation.settings
        self.model, self.layout = model, layout
        self.loader = data.loader_for(self.indices)
        self.theta: torch.Tensor | None = None
        self.int_buffers = None
        self.round_idx = -1
        self._update: torch.Tensor | None = None
        self._evaluated: dict[str, object] = {}  # this round's evaluations by the update's bits
        self.batches_per_epoch: int | None = None  # None: one pass over the root split per local epoch
        self.steps = 0  # optimizer steps of the last root update

    def begin_round(self, state, round_idx: int) -> None:
        self.theta, self.int_buffers, self.round_idx = state.theta, state.int_buffers, round_idx
        self._update = None
        self._evaluated = {}

    def _seed(self) -> int:
        return int(np.random.SeedSequence([self.settings.seed, self.round_idx, _ROOT_STREAM]).generate_state(1)[0])

    def update(self) -> torch.Tensor:
        """g_0: the root update of this round (trained once, then cached for the round)."""
        if self.theta is None:
            raise RuntimeError("ServerRoot.update before begin_round: the orchestrator calls begin_round first")
        if self._update is None:
            s, model, seed = self.settings, self.model, self._seed()
            self.layout.load(model, self.theta, self.int_buffers)
            model.import_local_state(None, seed=seed)
            seed_all(seed)
            model.begin_client(-1, self.round_idx)
            self.steps = local_train(self.fabric, model, self._loader_for_epoch(seed), s.local_epochs,
                                     lr_factor=s.lr_factor(self.round_idx),
                                     name=f"server root update, round {self.round_idx}", sam_rho=s.sam_rho)
            self._update = self.layout.flatten(model) - self.theta
        return self._update

    def _loader_for_epoch(self, seed: int) -> Callable[[int], object]:
        def one_pass(pass_seed: int):
            return self.data.train_loader_for(self.indices, seed=pass_seed)

        if self.batches_per_epoch is None:
            return lambda epoch: one_pass(seed + epoch)
        # passes per epoch: 1 when the root split has as many batches as a client (then as without matching)
        passes = math.ceil(self.batches_per_epoch / max(len(one_pass(seed)), 1))
        return lambda epoch: RootPasses(one_pass, seed + epoch * passes, self.batches_per_epoch)

    def evaluate(self, delta: torch.Tensor):
        """The client's EvalResult of theta_G + delta on the root split (utility, ufm_raw, ufm_se, ...), a function of
        (theta_G, round, delta) alone, evaluated as the server (clients/identity.py). So an update evaluated again in
        the round (a line-searching attack previews the rule ~16 times on the same honest updates) is read back."""
        key = state_sha256({"delta": delta})
        if key not in self._evaluated:
            self.layout.load(self.model, (self.theta.to(torch.float64) + delta.to(torch.float64)).to(torch.float32),
                             self.int_buffers)
            with as_server(self.model, self.round_idx):
                self._evaluated[key] = self.model.evaluate(self.loader)
        return self._evaluated[key]

