"""The client LightningModule contract shared by the detection and tabular clients."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import lightning as L
import numpy as np
import torch

from resfl_lightning.clients.plugin import ClientPlugin
from resfl_lightning.clients.settings import AdversarySettings, LossWeights
from resfl_lightning.config.sections import OptimSettings, UfmSettings
from resfl_lightning.losses.adversary import adversarial_loss
from resfl_lightning.losses.curvature import FisherCurvature, fisher_top_eigenpair
from resfl_lightning.losses.evidential import annealing_coefficient, group_balanced_mean
from resfl_lightning.losses.grl import dann_coefficient
from resfl_lightning.metrics.ufm import reported_ufm, ufm_bootstrap_se


def first_failure(first: torch.Tensor | None, failed: torch.Tensor, batch_idx: int) -> torch.Tensor:
    """The first batch index at which `failed` (a 0-d bool tensor) held, -1 while none has: kept on the device,
    so a per-step check costs no host synchronisation (the local loop reads it once per epoch)."""
    failed = failed.detach().reshape(())
    if first is None:
        return torch.where(failed, batch_idx, -1)
    return torch.where((first < 0) & failed, batch_idx, first)


@dataclass
class BatchCheck:
    """A per-step input check kept on the device: the first failing batch (-1: none) and what it held then."""

    first: torch.Tensor
    detail: torch.Tensor | None = None


@dataclass
class EvalResult:
    """What a client's validation pass measured (before it becomes a ClientReport)."""

    ufm_raw: float  # NaN when fewer than two groups were usable (see UfmSettings.min_group_persons)
    utility: float
    utility50: float
    eval_loss: float
    ufm_se: float = math.nan  # bootstrap standard error of ufm_raw over the split's images / samples
    val_delta_eop: float = math.nan  # the split's ΔEOP (the mechanism check correlates it with UFM)
    extras: dict[str, float] = field(default_factory=dict)


class FederatedClient(L.LightningModule):
    """One live instance per rank; the orchestrator loads theta_G and the client's own state into it per client.

    Parameters under LOCAL_PREFIXES (the adversary phi) are client-local: they are not part of theta, never leave
    the client, and travel between rounds through `export_local_state` / `import_local_state` (the rank's
    ClientStateStore), as do the curvature power-iteration vector, the UFM EMA and the plug-ins' state.

    `plugins` are the method's ClientPlugins (clients/plugin.py), attached by its Algorithm class; every hook is
    called in their order.
    """

    LOCAL_PREFIXES: tuple[str, ...] = ("adversary.",)

    def __init__(self, weights: LossWeights, ufm: UfmSettings, optim: OptimSettings,
                 adversary: AdversarySettings | None = None):
        super().__init__()
        self.weights, self.ufm, self.optim = weights, ufm, optim
        self.adversary_settings = adversary or AdversarySettings()
        self.round_idx = 0
        self.client_id = -1
        self._loss_sums: dict[str, torch.Tensor] = {}  # on the module's device; read back by mean_losses
        self._loss_count = 0
        self._batch_checks: dict[str, BatchCheck] = {}  # problem -> first failing batch, on the device
        self._ufm_ema = math.nan
        self.relative_gate: float | None = None  # set by the orchestrator each round when ufm.gate_mode=relative
        self._adv_inputs: tuple[torch.Tensor, torch.Tensor] | None = None
        self._local_seed: int | None = None  # the seed import_local_state drew a first phi from (reinit derives)
        self._epoch_position: tuple[int, int, int | None] = (0, 1, None)  # (epoch, epochs, batches): begin_epoch
        self.curvature = FisherCurvature(iters=weights.curv_iters, refresh=weights.curv_refresh,
                                          direction=weights.curv_direction)
        self.plugins: list[ClientPlugin] = []

    def add_plugin(self, plugin: ClientPlugin) -> None:
        """Attach a method's plug-in (before any gradient exists: its hooks may wrap the model's optimiser)."""
        self.plugins.append(plugin)

    def plugin_of(self, cls: type) -> ClientPlugin | None:
        """The attached plug-in of class `cls` (None: none)."""
        return next((p for p in self.plugins if isinstance(p, cls)), None)

    @property
    def per_example_loss(self) -> bool:
        """A plug-in needs the step's loss as a mean of per-example losses (DP-SGD's per-example clipping)."""
        return any(p.per_example_loss for p in self.plugins)

    @property
    def reversal_scale(self) -> float:
        """The GRL multiplier: lambda_priv scales the reversed gradient into theta (and nothing else)."""
        return self.weights.lambda_priv * self.weights.grl_scale

    def training_progress(self, batch_idx: int) -> float:
        """p in [0, 1]: the share of the run's rounds x local steps done before this step (the dann schedule's)."""
        epoch, epochs, batches = self._epoch_position
        within = epoch + (batch_idx / batches if batches else 0.0)
        p = (self.round_idx + within / epochs) / self.adversary_settings.rounds
        return min(max(p, 0.0), 1.0)

    def reversal_coefficient(self, batch_idx: int) -> float:
        """The GRL multiplier of this step: 0 during phi's warm-up rounds, else lambda_priv * grl_scale, times the
        dann ramp of the training progress under that schedule (docs/method.md §2)."""
        a = self.adversary_settings
        if self.round_idx < a.warmup_rounds:
            return 0.0
        if a.schedule == "constant":
            return self.reversal_scale
        return self.reversal_scale * dann_coefficient(self.training_progress(batch_idx), a.dann_gamma)

    def begin_epoch(self, epoch: int, epochs: int, batches: int | None) -> None:
        """Where the local loop is (the dann schedule's progress within a round); batches: None when unknown."""
        self._epoch_position = (epoch, max(epochs, 1), batches)

    # --- pieces subclasses provide ---------------------------------------------------------
    def curvature_parameters(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    def evaluate(self, loader) -> EvalResult:
        raise NotImplementedError

    def per_sample_losses(self, batch: dict) -> torch.Tensor:
        """Per-sample task losses of one batch (the Fisher's samples)."""
        raise NotImplementedError

    def bn_forward(self, batch: dict) -> None:
        """The model's forward on one batch, outputs unused (the SWA BatchNorm pass, federation/swa.py)."""
        raise NotImplementedError

    def _ufm_se(self, units) -> float:
        """Bootstrap SE of this client's UFM (ufm.bootstrap_resamples, 0 = off), seeded by client and round."""
        n = self.ufm.bootstrap_resamples
        if units is None or n <= 0:
            return math.nan
        return ufm_bootstrap_se(units, resamples=n, seed=self.client_id + 1 + 1000 * max(self.round_idx, 0),
                                evidence_floor=self.ufm.evidence_floor, eps=self.ufm.eps)

    def group_outcomes(self, loader, num_groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-group (true positives, positives) of this model on a loader and its (correct, total): the counts
        FairFed's server sums."""
        raise NotImplementedError

    def place(self, batch: dict) -> dict:
        """Move a batch to the module's device (a no-op outside Fabric)."""
        return self._fabric.to_device(batch) if self._fabric is not None else batch

    def validation_fim(self, loader, iters: int = 20) -> float:
        """Top eigenvalue of the empirical Fisher of the per-sample task loss on one validation batch."""
        was_training = self.training
        self.eval()  # BatchNorm on running statistics: the per-sample losses are independent samples
        with torch.enable_grad():
            losses = self.per_sample_losses(self.place(next(iter(loader))))
            eig, _ = fisher_top_eigenpair(losses, self.curvature_parameters(), iters=iters)
        self.train(was_training)
        return float(eig)

    # --- shared and client-local parameters ------------------------------------------------------
    @classmethod
    def is_local_key(cls, name: str) -> bool:
        return name.startswith(cls.LOCAL_PREFIXES)

    def shared_parameters(self) -> list[torch.nn.Parameter]:
        """theta: what the server aggregates (everything but the client-local modules)."""
        return [p for n, p in self.named_parameters() if not self.is_local_key(n)]

    def local_parameters(self) -> list[torch.nn.Parameter]:
        return [p for n, p in self.named_parameters() if self.is_local_key(n)]

    def export_local_state(self) -> dict[str, torch.Tensor]:
        """Everything this client keeps between its rounds (never sent to the server)."""
        state = {k: v for k, v in self.state_dict().items() if self.is_local_key(k)}
        if self.curvature.v is not None:
            state.update({f"curvature.v.{i}": v for i, v in enumerate(self.curvature.v)})
        state["ufm.ema"] = torch.tensor(self._ufm_ema, dtype=torch.float64)
        for plugin in self.plugins:  # e.g. DP-SGD's accountant history: a resumed run continues the accounting
            state.update(plugin.export_state())
        return state

    @torch.no_grad()
    def import_local_state(self, state: dict[str, torch.Tensor] | None, seed: int) -> None:
        """Load a client's own state, or give a client seen for the first time a fresh one drawn from `seed`."""
        self.curvature.reset()
        self.curvature.reseed(seed)
        for plugin in self.plugins:
            plugin.import_state(state)
        self._local_seed = seed
        if state is None:
            self._reset_local_modules(seed)
            self._ufm_ema = math.nan
            return
        own = self.state_dict(keep_vars=True)
        for k, v in state.items():
            if self.is_local_key(k):
                own[k].data.copy_(v)
        vs = [state[k] for k in sorted((k for k in state if k.startswith("curvature.v.")),
                                       key=lambda k: int(k.rsplit(".", 1)[1]))]
        self.curvature.v = [v.to(self.device) for v in vs] or None
        self._ufm_ema = float(state["ufm.ema"])

    @torch.no_grad()
    def _reset_local_modules(self, seed: int) -> None:
        """Fresh client-local modules (phi) drawn from `seed`, leaving the global RNG as it was."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for name, module in self.named_modules():
                if self.is_local_key(name + ".") and hasattr(module, "reset_parameters"):
                    module.reset_parameters()

    # --- shared behaviour ------------------------------------------------------------------
    def begin_client(self, client_id: int, round_idx: int) -> None:
        self.client_id, self.round_idx = client_id, round_idx
        self._epoch_position = (0, 1, None)
        # adversary_reinit: a new phi each client-round, drawn from (the client's first seed, round) alone. Only a
        # client whose own state was imported has that seed (the fine-tune loop keeps its phi across epochs).
        if self.adversary_settings.reinit and self._local_seed is not None:
            seed = np.random.SeedSequence([self._local_seed, round_idx + 1]).generate_state(1)[0]
            self._reset_local_modules(int(seed))
        self._loss_sums, self._loss_count = {}, 0
        self._batch_checks = {}
        for plugin in self.plugins:
            plugin.begin_round(self)

    # --- the plug-ins' hooks (clients/plugin.py) ------------------------------------------------------------------
    def round_seed(self, stream: int) -> int:
        """A seed of (the client's first seed, round, stream) alone: 1 process and N processes draw the same."""
        return int(np.random.SeedSequence([max(self._local_seed or 0, 0), self.round_idx + 1, stream])
                   .generate_state(1)[0])

    def receive(self, sent: Mapping[str, torch.Tensor]) -> None:
        """What the server sent with theta_G this round (ServerState.extra)."""
        for plugin in self.plugins:
            plugin.receive(self, sent)

    def start_local_training(self, loader_for_epoch: Callable[[int], Iterable]) -> None:
        """Before the round's first step (loader_for_epoch(e): the training loader of local epoch e)."""
        for plugin in self.plugins:
            plugin.start_training(self, loader_for_epoch)

    def epoch_batches(self, batches: Iterable) -> Iterable:
        """One local epoch's batches as the plug-ins draw them (DP-SGD: Poisson batches of the same dataset)."""
        for plugin in self.plugins:
            batches = plugin.loader(batches)
        return batches

    def step_without_loss(self, batch, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """The gradient norm of a step a plug-in took itself on this batch (DP-SGD: noise alone on an empty Poisson
        draw); None: the loop takes the loss's step."""
        for plugin in self.plugins:
            norm = plugin.step_without_loss(batch, optimizer)
            if norm is not None:
                return norm
        return None

    def plugin_terms(self, outputs, batch: dict) -> list[tuple[ClientPlugin, torch.Tensor]]:
        """The plug-ins' loss terms of this step, from its model outputs. A training step calls it at a fixed point
        of its forward: the forward's op order fixes the backward's summation order, hence the update's bits."""
        terms = []
        for plugin in self.plugins:
            term = plugin.loss_term(self, outputs, batch)
            if term is not None:
                terms.append((plugin, term))
        return terms

    def end_step(self) -> None:
        """After an optimizer step."""
        for plugin in self.plugins:
            plugin.after_step(self)

    def before_upload(self, val_loader) -> None:
        """After local training, before the update is taken."""
        for plugin in self.plugins:
            plugin.before_upload(self, val_loader)

    def sent_update(self, delta: torch.Tensor) -> torch.Tensor:
        """The update this client sends: theta_i - theta_G as the plug-ins transform it (itself without one)."""
        for plugin in self.plugins:
            delta = plugin.sent_update(self, delta)
        return delta

    def report_extras(self, val_loader) -> dict:
        """The plug-ins' entries of the round's ClientReport.extras."""
        extras: dict = {}
        for plugin in self.plugins:
            extras.update(plugin.report(self, val_loader))
        return extras

    def train(self, mode: bool = True):
        super().train(mode)
        for plugin in getattr(self, "plugins", ()):  # e.g. DP-SGD's per-sample gradient hooks only while training
            plugin.set_training(mode)
        return self

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The encoder/detector optimiser over theta only; phi has its own (`local_optimizers`)."""
        opt = torch.optim.SGD(self.shared_parameters(), lr=self.optim.lr, momentum=self.optim.momentum,
                              weight_decay=self.optim.weight_decay, nesterov=False)
        for plugin in self.plugins:
            opt = plugin.wrap_optimizer(opt)
        return opt

    def local_optimizers(self) -> list[torch.optim.Optimizer]:
        if self.weights.lambda_priv <= 0:
            return []
        return [self.adversary_settings.build(self.local_parameters())]

    # --- input checks of the training step, without a host read per step ------------------------------------------
    def check_batch(self, failed: torch.Tensor, batch_idx: int, problem: str,
                    detail: torch.Tensor | None = None) -> None:
        """Records on the device whether batch `batch_idx` failed the check `problem` (a fixed text) and, for the
        first failing batch, `detail` (a small tensor of the offending values). The local loop reads every check
        with its once-per-epoch read-back and raises a ValueError naming client, round, epoch and batch."""
        prev = self._batch_checks.get(problem)
        first = first_failure(None if prev is None else prev.first, failed, batch_idx)
        kept = None if prev is None else prev.detail
        if detail is not None:
            detail = detail.detach().reshape(-1)
            if kept is not None:  # keep the first failing batch's values
                detail = torch.where(first == batch_idx, detail, kept)
        self._batch_checks[problem] = BatchCheck(first, kept if detail is None else detail)

    def take_batch_checks(self) -> dict[str, BatchCheck]:
        """The checks recorded since the last call (the local loop takes them at every epoch's end)."""
        checks, self._batch_checks = self._batch_checks, {}
        return checks

    def adversary_loss(self, features: torch.Tensor, groups: torch.Tensor, batch_idx: int) -> torch.Tensor:
        """The adversary's CE through the GRL (scale lambda_priv); remembers its inputs for extra phi steps.

        A group index >= num_groups is checked on the device (`check_batch`; the epoch's end raises) and left out
        of the CE meanwhile: it never reaches cross_entropy, where a GPU would stop on a device-side assert."""
        self.adversary.grl_scale = self.reversal_coefficient(batch_idx)
        groups = groups.detach().reshape(-1).long()
        n = self.adversary.num_groups
        out_of_range = groups >= n
        self.check_batch(out_of_range.any(), batch_idx,
                         f"group labels must lie in -1..{n - 1} (-1 = unknown; the adversary has {n} groups), got max",
                         detail=groups.max().reshape(1) if groups.numel() else None)
        groups = groups.masked_fill(out_of_range, -1)
        self._adv_inputs = (features.detach(), groups)
        return adversarial_loss(self.adversary, features, groups, check=False)

    def extra_adversary_steps(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """adversary_steps - 1 more phi updates on this step's detached features (theta untouched)."""
        if not optimizers or self._adv_inputs is None or self.adversary_settings.steps <= 1:
            return
        features, groups = self._adv_inputs
        for _ in range(self.adversary_settings.steps - 1):
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            adversarial_loss(self.adversary, features, groups, check=False).backward()
            for opt in optimizers:
                opt.step()
        self._adv_inputs = None

    def compose_loss(self, task: torch.Tensor, adv: torch.Tensor, unc_values: torch.Tensor,
                     unc_groups: torch.Tensor, per_sample: torch.Tensor | None,
                     parts: dict[str, torch.Tensor], fair: torch.Tensor | None = None,
                     terms: list[tuple[ClientPlugin, torch.Tensor]] = ()) -> torch.Tensor:
        """lambda_task task + L_adv (GRL-scaled) + lambda_fair L_unc(group-balanced) + lambda_curv L_curv
        (+ w_fair L_fair when the baseline's feature-mean fairness term `fair` is given); each plug-in term of
        `plugin_terms` multiplies lambda_task by its task share and adds weight x term (ClientPlugin.weigh_term).

        L_adv enters unscaled: phi descends its own CE at its own learning rate, while the GRL hands theta
        -lambda_priv times the gradient, so the objective theta sees is task - lambda_priv CE (docs/method.md §2)."""
        w = self.weights
        unc = group_balanced_mean(unc_values, unc_groups) if unc_values.numel() else task * 0.0
        task_weight, weighed = w.lambda_task, []
        for plugin, term in terms:
            term_weights = plugin.weigh_term(term, task)
            task_weight = term_weights.task_share * task_weight
            weighed.append((term_weights, term))
        loss = task_weight * task + adv + w.lambda_fair * unc
        record = {**parts, "task": task.detach(), "adv": adv.detach(), "unc": unc.detach()}
        for term_weights, term in weighed:
            loss = loss + term_weights.weight * term
            record.update(term_weights.logged)
        if fair is not None:
            loss = loss + w.w_fair * fair
            record["fair"] = fair.detach()
        if w.lambda_curv > 0 and per_sample is not None:
            curv, eig = self.curvature(per_sample, self.curvature_parameters())
            loss = loss + w.lambda_curv * curv
            record["curv"] = curv.detach()
            record["fim_eig"] = torch.as_tensor(eig)
        record["total"] = loss.detach()
        self._accumulate(record)
        return loss

    def kl_coefficient(self) -> float:
        return annealing_coefficient(self.round_idx + 1, self.weights.anneal_rounds)

    def _accumulate(self, record: dict[str, torch.Tensor]) -> None:
        """Running sums on the device: no host synchronisation per step (the per-client means are logged per round
        from the report, `client/<i>/loss_<k>`)."""
        for k, v in record.items():
            v = torch.as_tensor(v).detach().to(torch.float64)
            self._loss_sums[k] = self._loss_sums[k] + v if k in self._loss_sums else v.clone()
        self._loss_count += 1

    def mean_losses(self) -> dict[str, float]:
        if not self._loss_sums:
            return {}
        n = max(self._loss_count, 1)
        keys = list(self._loss_sums)
        values = torch.stack([self._loss_sums[k].to(self._loss_sums[keys[0]].device) for k in keys]).cpu().tolist()
        return {k: v / n for k, v in zip(keys, values)}  # one read-back for every key

    def report_u(self, ufm_raw: float, utility: float) -> tuple[float, float, bool]:
        """EMA -> clip -> gate (docs/method.md §3), updating this client's EMA. Returns (EMA state, reported u, gated).

        A NaN raw UFM (fewer than two usable groups) reports `insufficient_u` and leaves the EMA untouched, so a
        client that lacks the minority is not rewarded for it."""
        u = self.ufm
        gate = u.gate if u.gate_mode == "absolute" else self.relative_gate
        gated = gate is not None and utility < gate
        if math.isnan(ufm_raw):
            return self._ufm_ema, (u.clip_high if gated else u.insufficient_u), gated
        prev = None if math.isnan(self._ufm_ema) else self._ufm_ema
        rep = reported_ufm(ufm_raw, utility, clip=(u.clip_low, u.clip_high), gate_map=gate,
                           ema_prev=prev if u.ema_decay is not None else None, ema_decay=u.ema_decay)
        self._ufm_ema = math.nan if rep.ema is None else rep.ema
        return self._ufm_ema, rep.u, gated

