"""Fabric-driven round loop (ARCHITECTURE "Data flow of one round").

Clients are dealt to ranks (client i -> rank i mod world_size); each rank owns ONE live client module and
replays it for each of its clients. Clients are never wrapped in DDP: the only collectives are one all_gather
of the small reports and one all_reduce of the weighted delta sum per round.
"""

from __future__ import annotations

import math
import os
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import lightning as L
import numpy as np
import torch

from resfl_lightning.aggregation.base import AggregationRule
from resfl_lightning.aggregation.streaming import StreamingWeightedSum, combine_normalisers
from resfl_lightning.clients.base import EvalResult, FederatedClient
from resfl_lightning.clients.plugin import ServerPlugin
from resfl_lightning.env import seed_all
from resfl_lightning.federation.checkpoint import ServerState, load_checkpoint, save_checkpoint
from resfl_lightning.federation.client_state import ClientStateStore
from resfl_lightning.federation.collectives import PROGRESS, Collectives
from resfl_lightning.federation.faults import FaultPlan, check_group_stats, check_update, warn_dropped
from resfl_lightning.federation.local import local_train
from resfl_lightning.federation.participation import deal, sample_clients, sample_size
from resfl_lightning.federation.root import ServerRoot
from resfl_lightning.federation.state import FlatLayout
from resfl_lightning.federation.swa import (
    batchnorm_layers,
    client_bn_statistics,
    combine_bn_statistics,
    statistic_mask,
    swa_step,
    write_bn_statistics,
)
from resfl_lightning.metrics.ufm import relative_gate_threshold
from resfl_lightning.types import ClientReport

UpdateTransform = Callable[[int, int, torch.Tensor], torch.Tensor]  # (client_id, round_idx, delta) -> delta
NOT_VALIDATED = EvalResult(ufm_raw=math.nan, utility=math.nan, utility50=math.nan, eval_loss=math.nan)


def has_items(loader) -> bool:
    """Whether a (map-style) loader has anything to evaluate; an iterable without a length counts as non-empty."""
    try:
        return len(loader.dataset) > 0
    except TypeError:
        return True


class SimulatedCrash(RuntimeError):
    """Raised after a checkpoint when debug.crash_after_round is set (to test resume)."""


class TooManySkippedRounds(RuntimeError):
    """More than federation.max_skipped_rounds rounds in a row were skipped (their quorum failed)."""


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
    # Server-side SWA (Caldarola et al. 2022; CurvFed Algorithm 2): from round swa_start on, the client lr runs a
    # cycle of swa_every rounds from swa_lr_high down to swa_lr_low (multiples of optim.lr), and the global model
    # is folded into the SWA average at the end of each cycle and at the final round. The SWA model is then the
    # one evaluated, checkpointed and exported; swa_bn_update recalibrates its BatchNorm statistics (swa.py).
    swa_start: int | None = None
    swa_every: int = 1
    swa_lr_high: float | None = None  # None: keep the step-decay schedule during SWA
    swa_lr_low: float | None = None
    swa_bn_update: bool = True
    sam_rho: float = 0.0  # > 0: SAM local optimiser (FedSAM, CurvFed)
    keep_best_epoch: bool = False  # CurvFed Algorithm 1: evaluate after each local epoch, keep the best
    client_state_memory_mb: float = 256.0
    gather_memory_mb: float = 4096.0  # budget for a gather-all rule's stacked updates (N x |theta| float32)
    client_validation: str = "every_round"  # when_used: skip the clients' validation where nothing reads it
    relative_gate_k: float | None = None  # ufm.gate_mode=relative: the k of median - k MAD (None: absolute gate)
    clients_per_round: int | float | None = None  # None: every client; a count; or a fraction in (0, 1]
    min_clients: int = 1  # quorum: a round with fewer aggregated clients is skipped (theta_G unchanged)
    max_skipped_rounds: int | None = None  # more skipped rounds in a row than this end the run (None: no limit)
    fail_clients: tuple[str, ...] = ()  # debug.fail_clients fault injection ("<client>:<round|*>:<fault>")
    kill_rank: int | None = None  # debug: this rank SIGKILLs itself at the start of kill_round
    kill_round: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.min_clients, bool) or int(self.min_clients) != self.min_clients or self.min_clients < 1:
            raise ValueError(f"federation.min_clients must be an integer >= 1, got {self.min_clients!r}")
        limit = self.max_skipped_rounds
        if limit is not None and (isinstance(limit, bool) or int(limit) != limit or limit < 0):
            raise ValueError(f"federation.max_skipped_rounds must be an integer >= 0 or null, got {limit!r}")
        if self.rounds < 1:
            raise ValueError(f"federation.rounds must be >= 1, got {self.rounds}")
        if self.local_epochs < 1:
            raise ValueError(f"federation.local_epochs must be >= 1, got {self.local_epochs}")
        if self.server_lr <= 0:
            raise ValueError(f"federation.server_lr must be > 0, got {self.server_lr}")
        if not 0 < self.lr_gamma <= 1:
            raise ValueError(f"federation.lr_gamma must be in (0, 1], got {self.lr_gamma}")
        if self.swa_start is not None and self.swa_start < 0:
            raise ValueError(f"algorithm.swa_start must be >= 0 or null, got {self.swa_start}")
        if self.swa_every < 1:
            raise ValueError(f"algorithm.swa_every must be >= 1, got {self.swa_every}")
        if (self.swa_lr_high is None) != (self.swa_lr_low is None):
            raise ValueError("algorithm.swa_lr_high and algorithm.swa_lr_low must both be set or both be null")
        if self.swa_lr_high is not None and not 0 < self.swa_lr_low <= self.swa_lr_high:
            raise ValueError(f"algorithm.swa_lr_low/high must satisfy 0 < low <= high, got "
                             f"{self.swa_lr_low}, {self.swa_lr_high}")
        if self.sam_rho < 0:
            raise ValueError(f"algorithm.sam_rho must be >= 0, got {self.sam_rho}")
        if self.client_validation not in ("every_round", "when_used"):
            raise ValueError(f"federation.client_validation must be every_round or when_used, "
                             f"got {self.client_validation!r}")

    def in_swa(self, round_idx: int) -> bool:
        return self.swa_start is not None and round_idx >= self.swa_start

    def swa_cycle_end(self, round_idx: int) -> bool:
        """The SWA average takes the global model at the end of each cycle (where the cyclical lr is lowest) and
        always the final round's (which a cycle longer than one round, or a start after it, could otherwise skip)."""
        if self.swa_start is None:
            return False
        if round_idx == self.rounds - 1:
            return True
        return self.in_swa(round_idx) and (round_idx - self.swa_start) % self.swa_every == self.swa_every - 1

    def lr_factor(self, round_idx: int) -> float:
        """Multiplier on optim.lr: step decay by round (x lr_gamma per milestone reached), or the SWA cycle."""
        if self.in_swa(round_idx) and self.swa_lr_high is not None:
            pos = (round_idx - self.swa_start) % self.swa_every
            frac = pos / (self.swa_every - 1) if self.swa_every > 1 else 1.0
            return self.swa_lr_high + (self.swa_lr_low - self.swa_lr_high) * frac
        return self.lr_gamma ** sum(round_idx >= m for m in self.lr_milestones)


def client_seed(seed: int, round_idx: int, client_id: int) -> int:
    """Independent of world size and of which rank trains the client."""
    return int(np.random.SeedSequence([seed, round_idx, client_id]).generate_state(1)[0])


RELATIVE_GATE_KEY = "relative_gate"
SKIPPED_STREAK_KEY = "skipped_rounds_in_a_row"  # in ServerState.extra (so resume keeps counting); absent when 0


def client_init_seed(seed: int, client_id: int) -> int:
    """Seed of a client's first own state (e.g. its adversary's initial weights): a function of (run seed, client)."""
    return int(np.random.SeedSequence([seed, client_id], spawn_key=(1,)).generate_state(1)[0])


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
    aggregator: AggregationRule
    settings: FederationSettings
    update_transforms: list[UpdateTransform] = field(default_factory=list)
    server_plugins: list[ServerPlugin] = field(default_factory=list)  # the method's (algorithm.server_plugins())
    logger_run_id: str = ""
    config: object = None  # the resolved run config (written to the run directory by RunFiles)

    def __post_init__(self) -> None:
        self.client_states = ClientStateStore(self.checkpoint_path.parent / "clients",
                                              int(self.settings.client_state_memory_mb * 2**20))
        self.faults = FaultPlan.parse(self.settings.fail_clients)
        self.collectives = Collectives(self.fabric)
        self.swa_bn_layers: list[str] = []  # shared BatchNorm layers the SWA model recalibrates (set by fit)
        self.swa_bn_mask: torch.Tensor | None = None  # their statistics' entries in the flat vector

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.settings.run_dir) / "checkpoints" / "last.pt"

    def participants(self, round_idx: int) -> list[int]:
        """The round's sampled clients (federation.clients_per_round), the same on every rank and world size."""
        return sample_clients(self.settings.seed, round_idx, self.data.num_clients, self.settings.clients_per_round)

    def own_clients(self, round_idx: int | None = None) -> list[int]:
        """This rank's share of the round's participants (possibly none); default: the round under way."""
        round_idx = PROGRESS.round_idx if round_idx is None else round_idx
        return deal(self.participants(round_idx), self.fabric.global_rank, self.fabric.world_size)

    def server_root(self, model: FederatedClient, layout: FlatLayout, size: int) -> ServerRoot:
        """The server's own labelled split (root.py), carved from the attack reserve now: a rule that trains or
        evaluates on it asks for it in its `attach`."""
        return ServerRoot(self, model, layout, size)

    # --- collectives (no-ops on one process; a dead or hanging peer raises PeerFailure) ------------
    def _gather(self, obj, step: str = "report all_gather"):
        return self.collectives.gather(obj, PROGRESS.round_idx, step)

    def _all_reduce_sum(self, t: torch.Tensor, step: str = "update all_reduce") -> torch.Tensor:
        return self.collectives.all_reduce_sum(t, PROGRESS.round_idx, step)

    def _barrier(self, step: str) -> None:
        self.collectives.barrier(PROGRESS.round_idx, step)

    # --- one client ------------------------------------------------------------------------------
    def train_client(self, client: FederatedClient, layout: FlatLayout, state: ServerState, client_id: int,
                     round_idx: int, times: RoundTimes) -> tuple[ClientReport, torch.Tensor]:
        fabric, s = self.fabric, self.settings
        layout.load(client, state.theta, state.int_buffers)
        cseed = client_seed(s.seed, round_idx, client_id)
        # The client's own state (phi, power-iteration vector, UFM EMA); a first-time client's is drawn from a
        # seed of (run seed, client) alone, so 1 process and N processes build the same one.
        client.import_local_state(self.client_states.get(client_id), seed=client_init_seed(s.seed, client_id))
        gate = state.extra.get(RELATIVE_GATE_KEY)
        client.relative_gate = None if gate is None else float(gate)
        client.receive(state.extra)  # what the method's server plug-ins pooled last round
        seed_all(cseed)
        client.begin_client(client_id, round_idx)
        self.faults.before_training(client_id, round_idx)
        val_loader = self.data.val_loader(client_id)
        best = BestEpoch(client, layout, val_loader) if s.keep_best_epoch else None
        t0 = time.perf_counter()
        with self.faults.during_training(client, client_id, round_idx):
            times.steps += local_train(
                fabric, client, lambda epoch: self.data.train_loader(client_id, seed=cseed + epoch), s.local_epochs,
                lr_factor=s.lr_factor(round_idx), name=f"client {client_id}, round {round_idx}", sam_rho=s.sam_rho,
                epoch_end=best)
        client.before_upload(val_loader)
        t1 = time.perf_counter()
        times.train += t1 - t0  # counted with the steps, also when the client is dropped after its training
        validated = self.clients_validate(round_idx)  # always with keep_best_epoch
        measured = validated and has_items(val_loader)
        if best is not None:
            result = best.restore()
        elif measured:
            result = client.evaluate(val_loader)
        else:  # skipped, or no validation item (dataset.small_clients=warn: u is then insufficient_u, as with too
            # few groups, and the update still counts); the loader's one torch RNG draw (its base seed) is kept, so
            # the Fisher's random start and every later draw are the same as when the clients validate
            iter(val_loader)
            result = NOT_VALIDATED
        delta = client.sent_update(layout.flatten(client) - state.theta)
        for transform in self.update_transforms:
            delta = transform(client_id, round_idx, delta)
        if validated:
            result, (ema, u, gated) = self._reported(client, layout, state, client_id, round_idx, result, delta,
                                                     val_loader)
        else:  # nothing reads it: NaN evaluation fields, and the client's UFM EMA is left as it was
            ema, u, gated = math.nan, math.nan, False
        fim = client.validation_fim(val_loader, iters=s.fim_iters) if s.report_fim else math.nan
        t2 = time.perf_counter()
        times.validate += t2 - t1
        report = ClientReport(
            client_id=client_id, num_samples=self.data.num_train(client_id), ufm_raw=result.ufm_raw, ufm_ema=ema,
            u=u, gated=gated, val_utility=result.utility, val_utility50=result.utility50,
            eval_loss=result.eval_loss, fim_eigenvalue=fim, ufm_se=result.ufm_se, val_delta_eop=result.val_delta_eop,
            train_losses=client.mean_losses(),
            timings={"train": t1 - t0, "validate": t2 - t1}, extras=client.report_extras(val_loader),
        )
        report, delta = self.faults.after_training(client_id, round_idx, report, delta)
        score = None if self.aggregator.gathers_all else self.aggregator.score(report)
        check_update(report, delta, score, client_id, round_idx, validated=measured)
        # Only a usable round updates the client's own state: a dropped client keeps its previous one.
        self.client_states.put(client_id, round_idx, client.export_local_state())
        return report, delta

    def clients_validate(self, round_idx: int) -> bool:
        """Whether the clients evaluate their trained model this round. federation.client_validation=when_used
        skips it in a non-final round when nothing reads the evaluation: an aggregation rule with
        uses_client_evaluation=False, no update transform with a `report` hook (Byzantine report modes) and no
        best-epoch selection. The final round always validates (the run's final per-client values)."""
        s = self.settings
        return (s.client_validation == "every_round" or round_idx == s.rounds - 1 or s.keep_best_epoch
                or self.aggregator.uses_client_evaluation
                or any(hasattr(t, "report") for t in self.update_transforms))

    def _reported(self, client: FederatedClient, layout: FlatLayout, state: ServerState, client_id: int,
                  round_idx: int, result, delta: torch.Tensor, val_loader):
        """(evaluation, (EMA, u, gated)) the client reports. An update transform with a `report` hook (Byzantine
        report modes, attacks/robustness.py) decides it; `validate_sent` evaluates theta_G + the update it sends."""
        def validate_sent():
            layout.load(client, state.theta + delta, state.int_buffers)
            return client.evaluate(val_loader) if has_items(val_loader) else NOT_VALIDATED

        for transform in self.update_transforms:
            if hasattr(transform, "report"):
                return transform.report(client_id, round_idx, result, validate_sent, client.report_u)
        return result, client.report_u(result.ufm_raw, result.utility)

    # --- the run ---------------------------------------------------------------------------------
    def initial_state(self, client: FederatedClient, layout: FlatLayout) -> ServerState:
        s = self.settings
        if s.resume and self.checkpoint_path.is_file():
            state = load_checkpoint(self.checkpoint_path)
            PROGRESS.saved_round, PROGRESS.checkpoint = state.round_idx, str(self.checkpoint_path)
            if state.theta.numel() != layout.numel:
                raise ValueError(f"checkpoint {self.checkpoint_path} holds {state.theta.numel()} values but the "
                                 f"configured model has {layout.numel}; was the config changed?")
            self.fabric.print(f"resuming from {self.checkpoint_path} after round {state.round_idx}")
            self.client_states.restore_to(state.round_idx)
            return state
        self.client_states.start_fresh()
        with self.collectives.guard(-1, "initial broadcast"):
            theta = self.fabric.broadcast(layout.flatten(client), src=0)
        return ServerState(round_idx=-1, theta=theta, int_buffers=layout.int_buffers(client),
                           logger_run_id=self.logger_run_id)

    def fit(self) -> ServerState:
        fabric, s = self.fabric, self.settings
        seed_all(s.seed)  # identical initial model on every rank
        client = self.client_factory()
        client = fabric.to_device(client)
        client.fabric = fabric  # lets the un-wrapped module log through Fabric
        layout = FlatLayout.of(client)
        if self.aggregator.gathers_all:  # fail before any training when the stacked updates cannot fit or count
            sampled = sample_size(s.clients_per_round, self.data.num_clients)
            self.aggregator.check_memory(sampled, layout.numel, s.gather_memory_mb)
            self.aggregator.check_clients(sampled)
        self.aggregator.attach(self, client, layout)  # server-side needs (FLTrust's root split) before any attack
        if s.swa_start is not None and s.swa_bn_update:
            self.swa_bn_layers = [n for n in batchnorm_layers(client) if f"{n}.running_mean" in layout.float_keys]
            self.swa_bn_mask = statistic_mask(layout, self.swa_bn_layers) if self.swa_bn_layers else None
        state = self.initial_state(client, layout)
        state.logger_run_id = state.logger_run_id or self.logger_run_id
        fabric.call("on_fit_start", federation=self, model=client, layout=layout, state=state)
        if self.round_transforms() and not self.aggregator.gathers_all:  # an omniscient attack gathers every round
            self.aggregator.check_memory(sample_size(s.clients_per_round, self.data.num_clients), layout.numel,
                                         s.gather_memory_mb)
        for round_idx in range(state.round_idx + 1, s.rounds):
            state = self.run_round(client, layout, state, round_idx)
        fabric.call("on_fit_end", federation=self, model=client, layout=layout, state=state)
        self._barrier("final barrier")
        return state

    def run_round(self, client: FederatedClient, layout: FlatLayout, state: ServerState,
                  round_idx: int) -> ServerState:
        fabric, s = self.fabric, self.settings
        times = RoundTimes()
        self.collectives.at(round_idx, "local training")
        if s.kill_rank == fabric.global_rank and s.kill_round == round_idx:  # debug: a rank dies (no-hang test)
            os.kill(os.getpid(), signal.SIGKILL)
        fabric.call("on_round_start", federation=self, round_idx=round_idx)
        state, stats_failed = self._prepare_aggregator(client, layout, state, round_idx)
        gather_all = self.aggregator.gathers_all or bool(self.round_transforms())
        acc = StreamingWeightedSum(layout.numel, device=state.theta.device)
        own_reports, own_dropped, own_updates = [], list(stats_failed.items()), []
        for client_id in self.own_clients(round_idx):
            if client_id in stats_failed:  # no server weight for it this round: training it would be wasted
                continue
            try:
                report, delta = self.train_client(client, layout, state, client_id, round_idx, times)
            except Exception as err:  # noqa: BLE001 - a failing client must not end the run (docs/design.md)
                reason = f"{type(err).__name__}: {err}"
                warn_dropped(client_id, round_idx, reason)
                own_dropped.append((client_id, reason))
                continue
            if gather_all:  # kept until every rank's updates are gathered
                own_updates.append((client_id, delta))
            else:
                acc.add(self.aggregator.score(report), delta)
            own_reports.append(report)
            fabric.call("on_client_end", federation=self, round_idx=round_idx, report=report, delta=delta,
                        layout=layout)
        t0 = time.perf_counter()
        gathered = self._gather((own_reports, own_dropped, acc.max_score, acc.normaliser, own_updates))
        reports = sorted((r for part in gathered for r in part[0]), key=lambda r: r.client_id)
        dropped = dict(sorted(d for part in gathered for d in part[1]))
        theta, skip = state.theta, self._quorum(len(reports), round_idx)
        if skip is None and not gather_all and not any(part[3] > 0 for part in gathered):
            skip = "every usable client update has aggregation weight 0"
        if skip is None:  # every rank takes the same branch: all of them saw the same gathered reports
            self.aggregator.begin_round(state, round_idx)
            mean_delta, skip, reports = self._aggregate(acc, gathered, reports, round_idx, gather_all)
        if skip is None:
            theta = (state.theta.to(torch.float64) + s.server_lr * mean_delta).to(torch.float32)
            if not torch.isfinite(theta).all():
                theta, skip = state.theta, "the aggregated model has non-finite values"
        if skip is None:
            state = self.aggregator.end_round(state)
        if skip is not None and fabric.is_global_zero:
            warnings.warn(f"round {round_idx}: skipped, theta_G unchanged: {skip}", RuntimeWarning, stacklevel=2)
        state = replace(state, round_idx=round_idx, theta=theta)
        state = self._count_skipped(state, skip is not None)
        state = self._update_swa(state, round_idx)
        if self.swa_bn_mask is not None and s.swa_cycle_end(round_idx):
            state = self._recalibrate_swa_bn(client, layout, state, reports, round_idx)
        state = self._next_relative_gate(state, reports)
        for plugin in self.server_plugins:
            state = plugin.end_round(state, reports)
        times.aggregate = time.perf_counter() - t0
        weights = self.aggregator.weights(reports)
        layout.load(client, state.model_theta, state.int_buffers)  # callbacks evaluate the new global (or SWA) model
        metrics: dict[str, float] = {"round": round_idx, "lr_factor": s.lr_factor(round_idx),
                                     "aggregation/gated_uniform": float(bool(reports) and all(r.gated
                                                                                               for r in reports)),
                                     "swa/count": float(state.swa_count),
                                     "round/sampled": float(len(reports) + len(dropped)),
                                     "round/aggregated": float(len(reports)), "round/dropped": float(len(dropped)),
                                     "round/skipped": float(skip is not None)}
        if skip is None:
            metrics.update(self.aggregator.round_metrics())
        metrics.update({f"client/{r.client_id}/dropped": 0.0 for r in reports})
        metrics.update({f"client/{i}/dropped": 1.0 for i in dropped})
        t1 = time.perf_counter()
        fabric.call("on_round_end", federation=self, round_idx=round_idx, reports=reports, weights=weights,
                    model=client, layout=layout, state=state, metrics=metrics)
        times.callbacks = time.perf_counter() - t1
        metrics.update({"time/train": times.train, "time/validate": times.validate,
                        "time/aggregate": times.aggregate, "time/callbacks": times.callbacks,
                        "time/steps": times.steps})
        fabric.call("on_metrics", federation=self, round_idx=round_idx, metrics=metrics, state=state)
        self.client_states.commit()  # every rank's client states are on disk before the round's checkpoint names it
        self._barrier("barrier before the checkpoint")
        if fabric.is_global_zero:
            save_checkpoint(self.checkpoint_path, state)
        self._barrier("barrier after the checkpoint")
        PROGRESS.saved_round, PROGRESS.checkpoint = round_idx, str(self.checkpoint_path)
        if s.crash_after_round is not None and round_idx == s.crash_after_round:
            raise SimulatedCrash(f"simulated crash after round {round_idx} (debug.crash_after_round)")
        self._stop_after_too_many_skipped(state, round_idx, skip)
        return state

    def round_transforms(self) -> list:
        """Update transforms that act on the whole gathered round (omniscient Byzantine attacks, the mimic report):
        `round_transform(round_idx, reports, deltas[N, P]) -> (reports, deltas)`; while one is installed every round
        gathers its updates (memory N x |theta| float32 on every rank, as a gather-all rule)."""
        return [t for t in self.update_transforms if getattr(t, "needs_round", False)]

    def _aggregate(self, acc: StreamingWeightedSum, gathered: list, reports: list[ClientReport], round_idx: int,
                   gather_all: bool) -> tuple[torch.Tensor | None, str | None, list[ClientReport]]:
        """(the round's aggregate update in float64, None, reports), or (None, why the round is skipped, reports):
        the all-reduced streaming sum, or the rule applied to every rank's updates stacked in client-id order (the
        same stack on every rank and world size, so every rank takes the same branch). A gathered round passes the
        stack and the reports through the round transforms first; a streaming rule then weighs the stack by its
        softmax weights (the same sum the streaming path folds)."""
        if not gather_all:
            gmax, gnorm = combine_normalisers([(part[2], part[3]) for part in gathered])
            return self._all_reduce_sum(acc.rescale_for_global(gmax, gnorm)), None, reports
        try:
            self.aggregator.check_clients(len(reports))
        except ValueError as err:  # e.g. dropped clients left Krum fewer than 2f + 3 updates
            return None, str(err), reports
        updates = dict(u for part in gathered for u in part[4])
        stacked = torch.stack([updates[r.client_id].to(acc.acc.device) for r in reports])
        for transform in self.round_transforms():
            reports, stacked = transform.round_transform(round_idx, reports, stacked)
        if self.aggregator.gathers_all:
            return self.aggregator.aggregate_round(stacked, reports), None, reports
        weights = self.aggregator.weights(reports)
        total = torch.zeros(stacked.shape[1], dtype=torch.float64, device=stacked.device)
        for r, row in zip(reports, stacked):
            total.add_(row.to(torch.float64), alpha=weights[r.client_id])
        return total, None, reports

    @staticmethod
    def _count_skipped(state: ServerState, skipped: bool) -> ServerState:
        """Rounds skipped in a row so far (kept in the checkpoint, so a resumed run goes on counting)."""
        extra = {k: v for k, v in state.extra.items() if k != SKIPPED_STREAK_KEY}
        if skipped:
            extra[SKIPPED_STREAK_KEY] = torch.tensor(skipped_in_a_row(state) + 1, dtype=torch.int64)
        return replace(state, extra=extra)

    def _stop_after_too_many_skipped(self, state: ServerState, round_idx: int, skip: str | None) -> None:
        """federation.max_skipped_rounds: every rank stops (after the round's checkpoint) once more rounds than the
        limit have been skipped in a row; the error names them and the last reason."""
        limit, streak = self.settings.max_skipped_rounds, skipped_in_a_row(state)
        if limit is None or streak <= limit:
            return
        first = round_idx - streak + 1
        rounds = f"round {first}" if streak == 1 else f"rounds {first}-{round_idx}"
        raise TooManySkippedRounds(
            f"{rounds}: {streak} round(s) in a row skipped, more than federation.max_skipped_rounds={limit}; the run "
            f"stops (round {round_idx}'s checkpoint is saved, resume=true continues). Last reason: {skip}")

    def _prepare_aggregator(self, client: FederatedClient, layout: FlatLayout, state: ServerState,
                            round_idx: int) -> tuple[ServerState, dict[int, str]]:
        """Aggregators whose weights depend on every client's view of the global model (FairFed) get, before local
        training, each client's per-group (TP, positives) counts of theta_G on its validation split. Returns the
        new state and the own clients whose statistics failed (they are dropped from the round, never the run)."""
        if not self.aggregator.needs_group_stats:
            return state, {}
        layout.load(client, state.theta, state.int_buffers)
        own, failed = {}, {}
        for cid in self.own_clients(round_idx):
            try:
                stats = tuple(t.numpy() for t in client.group_outcomes(self.data.val_loader(cid),
                                                                         self.data.num_groups))
                stats = self.faults.group_stats(cid, round_idx, stats)
                check_group_stats(stats, self.data.num_groups, cid, round_idx)
                own[cid] = stats
            except Exception as err:  # noqa: BLE001 - one client's statistics must not end the run
                failed[cid] = f"group statistics: {type(err).__name__}: {err}"
                warn_dropped(cid, round_idx, failed[cid])
        stats = {cid: v for part in self._gather(own, "group statistics all_gather") for cid, v in part.items()}
        return self.aggregator.prepare(state, stats, {cid: self.data.num_train(cid) for cid in stats}), failed

    def _quorum(self, aggregated: int, round_idx: int) -> str | None:
        """Why the round is skipped (None: apply it): fewer aggregated clients than federation.min_clients."""
        if aggregated >= self.settings.min_clients:
            return None
        return (f"{aggregated} client update(s) usable, federation.min_clients={self.settings.min_clients} "
                f"(sampled: {self.participants(round_idx)})")

    def _next_relative_gate(self, state: ServerState, reports: list[ClientReport]) -> ServerState:
        """ufm.gate_mode=relative: next round's gate is median - k MAD of this round's client utilities (the weights
        stream in as clients finish, so the gate cannot wait for the round's own reports)."""
        k = self.settings.relative_gate_k
        if k is None:
            return state
        thr = relative_gate_threshold([r.val_utility for r in reports], k)
        if thr is None:
            return state
        return replace(state, extra={**state.extra, RELATIVE_GATE_KEY: torch.tensor(thr, dtype=torch.float64)})

    def _update_swa(self, state: ServerState, round_idx: int) -> ServerState:
        """Fold theta_G into the SWA average at a cycle's end; with BatchNorm recalibration its statistics are not
        averaged (`_recalibrate_swa_bn` recomputes them)."""
        if not self.settings.swa_cycle_end(round_idx):
            return state
        swa = swa_step(state.swa, state.swa_count, state.theta, buffers=self.swa_bn_mask)
        return replace(state, swa=swa, swa_count=state.swa_count + 1)

    def _recalibrate_swa_bn(self, client: FederatedClient, layout: FlatLayout, state: ServerState,
                            reports: list[ClientReport], round_idx: int) -> ServerState:
        """Every aggregated client of the round makes one BatchNorm pass with w_SWA over its training split; the
        server combines the statistics by batch count (= torch's update_bn on the pooled batches, swa.py). A client
        whose pass fails is left out with a warning; with none left the statistics stay as they were."""
        own = set(self.own_clients(round_idx))
        layout.load(client, state.swa, state.int_buffers)
        parts = {}
        for cid in (r.client_id for r in reports if r.client_id in own):
            try:
                parts[cid] = client_bn_statistics(client, client.bn_forward, self.data.recalibration_loader(cid),
                                                  self.swa_bn_layers)
            except Exception as err:  # noqa: BLE001 - one client's pass must not end the run
                warnings.warn(f"round {round_idx}: client {cid} left out of the SWA BatchNorm recalibration: "
                              f"{type(err).__name__}: {err}", RuntimeWarning, stacklevel=2)
        merged = {cid: v for part in self._gather(parts, "SWA BatchNorm statistics all_gather")
                  for cid, v in part.items()}
        stats = combine_bn_statistics([merged[cid] for cid in sorted(merged)])
        return replace(state, swa=write_bn_statistics(state.swa, layout, stats)) if stats else state


def skipped_in_a_row(state: ServerState) -> int:
    """How many rounds up to state.round_idx were skipped in a row (0 when the last one was applied)."""
    streak = state.extra.get(SKIPPED_STREAK_KEY)
    return 0 if streak is None else int(streak)


class BestEpoch:
    """CurvFed Algorithm 1: evaluate on the client's eval split after every local epoch and keep the epoch with the
    lowest eval loss; `restore` loads that model back and returns its evaluation."""

    def __init__(self, client: FederatedClient, layout: FlatLayout, val_loader):
        self.client, self.layout, self.val_loader = client, layout, val_loader
        self.best = None  # (eval result, flat theta, integer buffers)

    def __call__(self, epoch: int) -> None:
        result = self.client.evaluate(self.val_loader)
        if self.best is None or result.eval_loss < self.best[0].eval_loss:
            self.best = (result, self.layout.flatten(self.client), self.layout.int_buffers(self.client))
        self.client.train()

    def restore(self):
        result, theta, int_buffers = self.best
        self.layout.load(self.client, theta, int_buffers)
        return result
