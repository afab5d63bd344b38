"""Fabric-driven round loop (ARCHITECTURE "Data flow of one round").

Clients are dealt to ranks (client i -> rank i mod world_size); each rank owns ONE live client module and
replays it for each of its clients. Clients are never wrapped in DDP: the only collectives are one all_gather
of the small reports and one all_reduce of the weighted delta sum per round.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.distributed as dist

from resfl_lightning.clients.base import FederatedClient
from resfl_lightning.federation.aggregation import Aggregator, StreamingWeightedSum, combine_normalisers
from resfl_lightning.federation.checkpoint import ServerState, load_checkpoint, save_checkpoint
from resfl_lightning.federation.local import local_train
from resfl_lightning.federation.state import FlatLayout
from resfl_lightning.types import ClientReport

UpdateTransform = Callable[[int, int, torch.Tensor], torch.Tensor]  # (client_id, round_idx, delta) -> delta


class SimulatedCrash(RuntimeError):
    """Raised after a checkpoint when debug.crash_after_round is set (to test resume)."""


@dataclass
class FederationSettings:
    rounds: int = 20
    local_epochs: int = 1
    server_lr: float = 1.0
    lr_milestones: tuple[int, ...] = (50, 75)
    lr_gamma: float = 0.1
    seed: int = 0
    resume: bool = False
    run_dir: Path = Path("runs/default")
    report_fim: bool = False
    fim_iters: int = 20
    crash_after_round: int | None = None
    swa_start: int | None = None  # CurvFed server-side SWA: first round averaged
    swa_every: int = 1

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"federation.rounds must be >= 1, got {self.rounds}")
        if self.local_epochs < 1:
            raise ValueError(f"federation.local_epochs must be >= 1, got {self.local_epochs}")
        if self.server_lr <= 0:
            raise ValueError(f"federation.server_lr must be > 0, got {self.server_lr}")
        if not 0 < self.lr_gamma <= 1:
            raise ValueError(f"federation.lr_gamma must be in (0, 1], got {self.lr_gamma}")

    def lr_factor(self, round_idx: int) -> float:
        """Step decay by round: x lr_gamma at each milestone already reached."""
        return self.lr_gamma ** sum(round_idx >= m for m in self.lr_milestones)


def client_seed(seed: int, round_idx: int, client_id: int) -> int:
    """Independent of world size and of which rank trains the client."""
    return int(np.random.SeedSequence([seed, round_idx, client_id]).generate_state(1)[0])


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class RoundTimes:
    train: float = 0.0
    validate: float = 0.0
    aggregate: float = 0.0
    callbacks: float = 0.0
    steps: int = 0


@dataclass
class Federation:
    fabric: L.Fabric
    client_factory: Callable[[], FederatedClient]
    data: object  # resfl_lightning.data.federated.FederatedData
    aggregator: Aggregator
    settings: FederationSettings
    update_transforms: list[UpdateTransform] = field(default_factory=list)
    logger_run_id: str = ""
    config: object = None  # the resolved run config (written to the run directory by RunFiles)

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.settings.run_dir) / "checkpoints" / "last.pt"

    def own_clients(self) -> list[int]:
        f = self.fabric
        return [i for i in range(self.data.num_clients) if i % f.world_size == f.global_rank]

    # --- collectives (no-ops on one process) -------------------------------------------------------
    def _gather(self, obj):
        if self.fabric.world_size == 1:
            return [obj]
        out = [None] * self.fabric.world_size
        dist.all_gather_object(out, obj)
        return out

    def _all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.fabric.all_reduce(t, reduce_op="sum") if self.fabric.world_size > 1 else t

    # --- one client ------------------------------------------------------------------------------
    def train_client(self, client: FederatedClient, layout: FlatLayout, state: ServerState, client_id: int,
                     round_idx: int, times: RoundTimes) -> tuple[ClientReport, torch.Tensor]:
        fabric, s = self.fabric, self.settings
        layout.load(client, state.theta, state.int_buffers)
        cseed = client_seed(s.seed, round_idx, client_id)
        seed_all(cseed)
        client.begin_client(client_id, round_idx)
        t0 = time.perf_counter()
        times.steps += local_train(
            fabric, client, lambda epoch: self.data.train_loader(client_id, seed=cseed + epoch), s.local_epochs,
            lr_factor=s.lr_factor(round_idx), name=f"client {client_id}, round {round_idx}")
        t1 = time.perf_counter()
        val_loader = self.data.val_loader(client_id)
        result = client.evaluate(val_loader)
        ema, u, gated = client.report_u(result.ufm_raw, result.utility, float(state.ufm_ema[client_id]))
        fim = client.validation_fim(val_loader, iters=s.fim_iters) if s.report_fim else math.nan
        t2 = time.perf_counter()
        times.train += t1 - t0
        times.validate += t2 - t1
        report = ClientReport(
            client_id=client_id, num_samples=self.data.num_train(client_id), ufm_raw=result.ufm_raw, ufm_ema=ema,
            u=u, gated=gated, val_utility=result.utility, val_utility50=result.utility50,
            eval_loss=result.eval_loss, fim_eigenvalue=fim, train_losses=client.mean_losses(),
            timings={"train": t1 - t0, "validate": t2 - t1},
        )
        delta = layout.flatten(client) - state.theta
        for transform in self.update_transforms:
            delta = transform(client_id, round_idx, delta)
        if not torch.isfinite(delta).all():
            raise FloatingPointError(f"client {client_id}, round {round_idx}: update has non-finite values")
        return report, delta

    # --- the run ---------------------------------------------------------------------------------
    def initial_state(self, client: FederatedClient, layout: FlatLayout) -> ServerState:
        s = self.settings
        if s.resume and self.checkpoint_path.is_file():
            state = load_checkpoint(self.checkpoint_path)
            if state.theta.numel() != layout.numel:
                raise ValueError(f"checkpoint {self.checkpoint_path} holds {state.theta.numel()} values but the "
                                 f"configured model has {layout.numel}; was the config changed?")
            self.fabric.print(f"resuming from {self.checkpoint_path} after round {state.round_idx}")
            return state
        theta = self.fabric.broadcast(layout.flatten(client), src=0)
        return ServerState(round_idx=-1, theta=theta, int_buffers=layout.int_buffers(client),
                           ufm_ema=torch.full((self.data.num_clients,), math.nan, dtype=torch.float64),
                           logger_run_id=self.logger_run_id)

    def fit(self) -> ServerState:
        fabric, s = self.fabric, self.settings
        seed_all(s.seed)  # identical initial model on every rank
        client = self.client_factory()
        client = fabric.to_device(client)
        client.fabric = fabric  # lets the un-wrapped module log through Fabric
        layout = FlatLayout.of(client)
        state = self.initial_state(client, layout)
        state.logger_run_id = state.logger_run_id or self.logger_run_id
        fabric.call("on_fit_start", federation=self, model=client, layout=layout, state=state)
        for round_idx in range(state.round_idx + 1, s.rounds):
            state = self.run_round(client, layout, state, round_idx)
        fabric.call("on_fit_end", federation=self, model=client, layout=layout, state=state)
        fabric.barrier()
        return state

    def run_round(self, client: FederatedClient, layout: FlatLayout, state: ServerState,
                  round_idx: int) -> ServerState:
        fabric, s = self.fabric, self.settings
        times = RoundTimes()
        fabric.call("on_round_start", federation=self, round_idx=round_idx)
        acc = StreamingWeightedSum(layout.numel, device=state.theta.device)
        own_reports = []
        for client_id in self.own_clients():
            report, delta = self.train_client(client, layout, state, client_id, round_idx, times)
            acc.add(self.aggregator.score(report), delta)
            own_reports.append(report)
            fabric.call("on_client_end", federation=self, round_idx=round_idx, report=report, delta=delta,
                        layout=layout)
        t0 = time.perf_counter()
        gathered = self._gather((own_reports, acc.max_score, acc.normaliser))
        reports = sorted((r for part in gathered for r in part[0]), key=lambda r: r.client_id)
        gmax, gnorm = combine_normalisers([(m, z) for _, m, z in gathered])
        mean_delta = self._all_reduce_sum(acc.rescale_for_global(gmax, gnorm))
        theta = (state.theta.to(torch.float64) + s.server_lr * mean_delta).to(torch.float32)
        ema = state.ufm_ema.clone()
        for r in reports:
            ema[r.client_id] = r.ufm_ema
        state = replace(state, round_idx=round_idx, theta=theta, ufm_ema=ema)
        state = self._update_swa(state, round_idx)
        times.aggregate = time.perf_counter() - t0
        weights = self.aggregator.weights(reports)
        layout.load(client, state.theta, state.int_buffers)  # callbacks evaluate the new global model
        metrics: dict[str, float] = {"round": round_idx, "lr_factor": s.lr_factor(round_idx)}
        t1 = time.perf_counter()
        fabric.call("on_round_end", federation=self, round_idx=round_idx, reports=reports, weights=weights,
                    model=client, layout=layout, state=state, metrics=metrics)
        times.callbacks = time.perf_counter() - t1
        metrics.update({"time/train": times.train, "time/validate": times.validate,
                        "time/aggregate": times.aggregate, "time/callbacks": times.callbacks,
                        "time/steps": times.steps})
        fabric.call("on_metrics", federation=self, round_idx=round_idx, metrics=metrics, state=state)
        if fabric.is_global_zero:
            save_checkpoint(self.checkpoint_path, state)
        fabric.barrier()
        if s.crash_after_round is not None and round_idx == s.crash_after_round:
            raise SimulatedCrash(f"simulated crash after round {round_idx} (debug.crash_after_round)")
        return state

    def _update_swa(self, state: ServerState, round_idx: int) -> ServerState:
        s = self.settings
        if s.swa_start is None or round_idx < s.swa_start or (round_idx - s.swa_start) % s.swa_every:
            return state
        n = state.swa_count
        swa = state.theta.clone() if state.swa is None else state.swa + (state.theta - state.swa) / (n + 1)
        return replace(state, swa=swa, swa_count=n + 1)
