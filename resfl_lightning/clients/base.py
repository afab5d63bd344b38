"""The client LightningModule contract shared by the detection and tabular clients."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import lightning as L
import numpy as np
import torch

from resfl_lightning.clients.parity_rates import SENSITIVITY
from resfl_lightning.config.sections import OptimSettings, UfmSettings
from resfl_lightning.losses.adversary import adversarial_loss
from resfl_lightning.losses.curvature import FisherCurvature, fisher_top_eigenpair
from resfl_lightning.losses.evidential import annealing_coefficient, group_balanced_mean
from resfl_lightning.losses.grl import GRL_SCHEDULES, dann_coefficient
from resfl_lightning.losses.parity import parity_gap
from resfl_lightning.losses.roi_mean import ROI_IMPLS
from resfl_lightning.metrics.ufm import reported_ufm, ufm_bootstrap_se


@dataclass
class LossWeights:
    """L_local = lambda_task L_task + lambda_priv L_adv + lambda_fair L_unc + lambda_curv L_curv + w_fair L_fair
    (docs/method.md); built by the algorithm (resfl_lightning/algorithms/base.py), whose schema checks the values."""

    lambda_priv: float = 0.1
    lambda_fair: float = 0.01
    lambda_curv: float = 0.0
    grl_scale: float = 1.0
    anneal_rounds: int = 10  # KL annealing min(1, t / t_anneal) with t counted in rounds
    curv_iters: int = 3  # power iterations per step (warm-started)
    curv_params: str = "head"  # "head" or "all"

    lambda_task: float = 1.0  # CurvFed writes its loss as (1 - a) L_task + a L_curv: lambda_task = 1 - a
    w_fair: float = 0.0  # puffle_resfl / PFU-FL / PrivFairFL-Pre: weight of L_fair (losses/fairness.py)
    lambda_parity: float = 0.0  # PUFFLE: (1 - lambda) task + lambda x parity gap of the predictions (losses/parity.py)


@dataclass
class AdversarySettings:
    """phi's strength (docs/method.md §2): its own optimiser (RESFL Algorithm 1, line 8; lambda_priv scales only the
    reversed gradient into theta), capacity, warm-up, GRL schedule and whether it is kept across rounds. Built by
    the algorithm from algorithm.adversary_* (checked there); the defaults are the paper-minimal reading."""

    lr: float = 1e-3
    optimizer: str = "adam"  # adam | sgd
    steps: int = 1  # adversary updates per encoder step (extra ones reuse the step's detached features)
    hidden: int = 128
    depth: int = 1  # hidden layers of phi (0: a linear probe)
    warmup_rounds: int = 0  # first rounds in which phi trains but the reversed gradient into theta is 0
    schedule: str = "constant"  # GRL coefficient over training: constant | dann (Ganin et al. 2016)
    dann_gamma: float = 10.0
    reinit: bool = False  # a fresh phi every client-round instead of the client's kept one
    roi_bins: int = 7  # detection: roi_align output size before the box mean (losses/adversary.py)
    roi_samples: int = -1  # detection: roi_align sampling ratio (-1: adaptive per box)
    roi_impl: str = "roi_align"  # detection: how the box mean is computed (losses/adversary.py ROI_IMPLS)
    rounds: int | None = None  # the run's horizon T: the dann schedule's progress is counted over it

    def __post_init__(self) -> None:
        if self.schedule not in GRL_SCHEDULES:
            raise ValueError(f"adversary schedule must be one of {GRL_SCHEDULES}, got {self.schedule!r}")
        if self.roi_bins < 1 or self.roi_samples == 0 or self.roi_samples < -1:
            raise ValueError(f"adversary ROI pooling: bins >= 1 and samples -1 or >= 1, got {self.roi_bins}, "
                             f"{self.roi_samples}")
        if self.roi_impl not in ROI_IMPLS:
            raise ValueError(f"adversary ROI pooling: impl must be one of {ROI_IMPLS}, got {self.roi_impl!r}")
        if self.schedule == "dann" and (self.rounds is None or self.rounds < 1):
            raise ValueError(f"the dann GRL schedule needs the run's number of rounds (>= 1), got {self.rounds}")

    def build(self, params) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9)


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
    ClientStateStore), as do the curvature power-iteration vector and the UFM EMA.
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
        self.curvature = FisherCurvature(iters=weights.curv_iters)
        # Algorithm plug-ins (resfl_lightning/algorithms/): DP-SGD, a pre-upload transform, report statistics.
        self.dp = None
        self.upload_transform = None
        self.report_statistics = None
        self.parity_lambda = None  # PUFFLE's tunable lambda (clients/parity_lambda.py); None: fixed lambda_parity
        self._step_gap: torch.Tensor | None = None  # the step's parity gap, for the tunable lambda's update
        self.parity_fallback = None  # PUFFLE's global P(k|z) for absent groups (clients/parity_rates.py); None: off

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
        if self.dp is not None:
            state.update(self.dp.export_state())  # the accountant's history: resume continues the accounting
        if self.parity_lambda is not None:
            state.update(self.parity_lambda.export_state())
        return state

    @torch.no_grad()
    def import_local_state(self, state: dict[str, torch.Tensor] | None, seed: int) -> None:
        """Load a client's own state, or give a client seen for the first time a fresh one drawn from `seed`."""
        self.curvature.reset()
        self.curvature.reseed(seed)
        if self.dp is not None:
            self.dp.import_state(state)
        if self.parity_lambda is not None:
            self.parity_lambda.import_state(state)
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
        if self.upload_transform is not None:
            self.upload_transform.begin(self)

    # --- PUFFLE's tunable lambda and missing-group fallback (clients/parity_lambda.py, parity_rates.py) --
    @property
    def uses_parity(self) -> bool:
        """The step computes PUFFLE's gap: a fixed lambda > 0, or the tunable lambda (its update needs the gap)."""
        return self.weights.lambda_parity > 0 or self.parity_lambda is not None

    def parity_mass(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-unit parity mass, unit groups) of one batch (losses/parity.py), for the training split's gap."""
        raise NotImplementedError

    @torch.no_grad()
    def dataset_parity_mass(self, loader) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(mass, groups) of this (received) model over every unit of a loader, in eval mode; None: no unit."""
        was_training = self.training
        self.eval()
        masses, groups = [], []
        for batch in loader:
            mass, g = self.parity_mass(self.place(batch))
            masses.append(mass.float())
            groups.append(g.reshape(-1))
        self.train(was_training)
        return (torch.cat(masses), torch.cat(groups)) if masses else None

    def dataset_parity_gap(self, loader) -> float:
        """PUFFLE's D_train: the gap of this (received) model over every unit of a loader, in eval mode."""
        return _units_gap(self.dataset_parity_mass(loader))

    def _round_seed(self, stream: int) -> int:
        """A seed of (the client's first seed, round, stream) alone: 1 process and N processes draw the same."""
        return int(np.random.SeedSequence([max(self._local_seed or 0, 0), self.round_idx + 1, stream])
                   .generate_state(1)[0])

    @property
    def global_parity_rates(self) -> torch.Tensor | None:
        """The server's P(k|z) the parity gap falls back on for an absent group (None: no fallback)."""
        return None if self.parity_fallback is None else self.parity_fallback.rates

    def receive_parity_counts(self, pooled: torch.Tensor | None) -> None:
        """The server's pooled (k, z) counts of the last round (ServerState.extra), when the fallback is on."""
        if self.parity_fallback is not None:
            self.parity_fallback.receive(pooled)

    def shared_parity_counts(self) -> list[list[float]]:
        """The (noisy) (k, z) counts this client released this round ([] when the fallback is off)."""
        return [] if self.parity_fallback is None else self.parity_fallback.report()

    def _release_parity_counts(self, units: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """The round's counts over the training split, noised for epsilon_stat under DP (exact without DP); the
        noise is drawn from (the client's first seed, round) alone."""
        std = None if self.dp is None else self.dp.stat_sigma * SENSITIVITY
        self.parity_fallback.release(*(units or (None, None)), std=std, seed=self._round_seed(6))
        if self.dp is not None and units is not None:
            self.dp.account_stat()

    def start_local_training(self, loader_for_epoch) -> None:
        """Before the round's first step, from one pass of the received model over the training split: PUFFLE's
        shared counts (when the fallback is on) and the tunable lambda's round-start value from D_train (0 in the
        client's first round) and its noise generator, drawn from (the client's first seed, round) alone."""
        tunable, fallback = self.parity_lambda, self.parity_fallback
        wants_gap = tunable is not None and not tunable.first_round
        units = self.dataset_parity_mass(loader_for_epoch(0)) if wants_gap or fallback is not None else None
        if fallback is not None:
            self._release_parity_counts(units)
        if tunable is None:
            return
        tunable.begin_round(_units_gap(units) if wants_gap else None, self.round_idx, self._round_seed(5))
        self._step_gap = None

    def end_step(self) -> None:
        """After an optimizer step: the tunable lambda's update from the step's gap, noised for epsilon_lambda."""
        if self.parity_lambda is None or self._step_gap is None:
            return
        sigma = self.dp.lambda_sigma if self.dp is not None else None
        self.parity_lambda.step(self._step_gap, sigma)
        if sigma is not None:
            self.dp.account_lambda()
        self._step_gap = None

    def before_upload(self, val_loader) -> None:
        """After local training, before the update is taken (PrivFairFL-Pre perturbs and calibrates here)."""
        if self.upload_transform is not None:
            self.upload_transform.apply(self, val_loader)

    def dp_epsilon(self) -> float:
        """Epsilon this client has spent so far (DP-SGD); NaN without DP."""
        return self.dp.epsilon() if self.dp is not None else math.nan

    def dp_statistics(self) -> dict[str, float]:
        """This client's DP-SGD accounting numbers (z, q, steps, B, C, epsilon target, delta, NSR); {} without DP."""
        return self.dp.statistics() if self.dp is not None else {}

    def calibration_statistics(self, val_loader) -> dict[str, float]:
        """Aggregate validation statistics a server-side calibration needs (PrivFairFL-Post); {} otherwise."""
        return self.report_statistics(self, val_loader) if self.report_statistics is not None else {}

    def train(self, mode: bool = True):
        super().train(mode)
        if getattr(self, "dp", None) is not None:  # per-sample gradient hooks only while training
            self.dp.set_training(mode)
        return self

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The encoder/detector optimiser over theta only; phi has its own (`local_optimizers`)."""
        opt = torch.optim.SGD(self.shared_parameters(), lr=self.optim.lr, momentum=self.optim.momentum,
                              weight_decay=self.optim.weight_decay, nesterov=False)
        return self.dp.wrap_optimizer(opt) if self.dp is not None else opt

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
                     parity: torch.Tensor | None = None) -> torch.Tensor:
        """lambda_task task + L_adv (GRL-scaled) + lambda_fair L_unc(group-balanced) + lambda_curv L_curv
        (+ w_fair L_fair when the baseline's feature-mean fairness term `fair` is given; PUFFLE's `parity` gap turns
        the task weight into (1 - lambda_parity) lambda_task and adds lambda_parity x parity).

        L_adv enters unscaled: phi descends its own CE at its own learning rate, while the GRL hands theta
        -lambda_priv times the gradient, so the objective theta sees is task - lambda_priv CE (docs/method.md §2)."""
        w = self.weights
        unc = group_balanced_mean(unc_values, unc_groups) if unc_values.numel() else task * 0.0
        lam = w.lambda_parity
        if parity is not None and self.parity_lambda is not None:  # tunable: this step's lambda; the gap updates it
            lam = self.parity_lambda.weight(task)
            self._step_gap = parity.detach()
        if parity is None:
            loss = w.lambda_task * task + adv + w.lambda_fair * unc
        else:
            loss = (1.0 - lam) * w.lambda_task * task + adv + w.lambda_fair * unc
        record = {**parts, "task": task.detach(), "adv": adv.detach(), "unc": unc.detach()}
        if parity is not None:
            loss = loss + lam * parity
            record["parity"] = parity.detach()
            if self.parity_lambda is not None:
                record["lambda_parity"] = lam.detach()
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


def _units_gap(units: tuple[torch.Tensor, torch.Tensor] | None) -> float:
    """The parity gap of (mass, groups) over a whole split; 0 without any unit."""
    return 0.0 if units is None else float(parity_gap(*units))
