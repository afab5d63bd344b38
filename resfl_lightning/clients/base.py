"""The client LightningModule contract shared by the detection and tabular clients."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import lightning as L
import torch

from resfl_lightning.losses.curvature import FisherCurvature, fisher_top_eigenpair
from resfl_lightning.losses.evidential import annealing_coefficient, group_balanced_mean
from resfl_lightning.metrics.ufm import reported_ufm


@dataclass
class LossWeights:
    """L_local = L_task + lambda_priv L_adv + lambda_fair L_unc + lambda_curv L_curv (SPEC §2)."""

    lambda_priv: float = 0.1
    lambda_fair: float = 0.01
    lambda_curv: float = 0.0
    grl_scale: float = 1.0
    anneal_rounds: int = 10  # KL annealing min(1, t / t_anneal) with t counted in rounds
    curv_iters: int = 3  # power iterations per step (warm-started)
    curv_params: str = "head"  # "head" or "all"

    def __post_init__(self) -> None:
        for key in ("lambda_priv", "lambda_fair", "lambda_curv", "grl_scale"):
            if getattr(self, key) < 0:
                raise ValueError(f"algorithm.{key} must be >= 0, got {getattr(self, key)}")
        if self.anneal_rounds < 1:
            raise ValueError(f"algorithm.anneal_rounds must be >= 1, got {self.anneal_rounds}")
        if self.curv_params not in ("head", "all"):
            raise ValueError(f"algorithm.curv_params must be 'head' or 'all', got {self.curv_params!r}")


@dataclass
class UfmSettings:
    """UFM protocol knobs (SPEC §3)."""

    score_threshold: float = 0.25
    iou_threshold: float = 0.5
    eps: float = 1e-6
    evidence_floor: float = 1e-3
    clip_low: float = 0.0
    clip_high: float = 5.0
    gate: float = 0.30
    ema_decay: float | None = None
    cohorts: str = "groups"  # groups | cluster | slices | proxy
    num_cohorts: int = 3
    drop_fraction: float = 0.0
    flip_rate: float = 0.0

    def __post_init__(self) -> None:
        if self.clip_low > self.clip_high:
            raise ValueError(f"ufm.clip_low ({self.clip_low}) must be <= ufm.clip_high ({self.clip_high})")
        if self.ema_decay is not None and not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ufm.ema_decay must be in [0, 1), got {self.ema_decay}")
        if not 0.0 <= self.score_threshold <= 1.0:
            raise ValueError(f"ufm.score_threshold must be in [0, 1], got {self.score_threshold}")
        for key in ("drop_fraction", "flip_rate"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"ufm.{key} must be in [0, 1], got {getattr(self, key)}")
        if self.cohorts not in ("groups", "cluster", "slices", "proxy"):
            raise ValueError(f"ufm.cohorts must be groups, cluster, slices or proxy, got {self.cohorts!r}")
        if self.num_cohorts < 2:
            raise ValueError(f"ufm.num_cohorts must be >= 2, got {self.num_cohorts}")


@dataclass
class OptimSettings:
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 1e-4
    grad_clip: float | None = 10.0

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")


@dataclass
class EvalResult:
    """What a client's validation pass measured (before it becomes a ClientReport)."""

    ufm_raw: float
    utility: float
    utility50: float
    eval_loss: float
    extras: dict[str, float] = field(default_factory=dict)


class FederatedClient(L.LightningModule):
    """One live instance per rank; the orchestrator loads theta_G into it for each client it simulates."""

    def __init__(self, weights: LossWeights, ufm: UfmSettings, optim: OptimSettings):
        super().__init__()
        self.weights, self.ufm, self.optim = weights, ufm, optim
        self.round_idx = 0
        self.client_id = -1
        self._loss_sums: dict[str, float] = {}
        self._loss_count = 0
        self.curvature = FisherCurvature(iters=weights.curv_iters)

    # --- pieces subclasses provide ---------------------------------------------------------
    def curvature_parameters(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError

    def evaluate(self, loader) -> EvalResult:
        raise NotImplementedError

    def per_sample_losses(self, batch: dict) -> torch.Tensor:
        """Per-sample task losses of one batch (the Fisher's samples)."""
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

    # --- shared behaviour ------------------------------------------------------------------
    def begin_client(self, client_id: int, round_idx: int) -> None:
        self.client_id, self.round_idx = client_id, round_idx
        self._loss_sums, self._loss_count = {}, 0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.optim.lr, momentum=self.optim.momentum,
                               weight_decay=self.optim.weight_decay, nesterov=False)

    def compose_loss(self, task: torch.Tensor, adv: torch.Tensor, unc_values: torch.Tensor,
                     unc_groups: torch.Tensor, per_sample: torch.Tensor | None,
                     parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """task + lambda_priv adv + lambda_fair L_unc(group-balanced) + lambda_curv L_curv; records every part."""
        w = self.weights
        unc = group_balanced_mean(unc_values, unc_groups) if unc_values.numel() else task * 0.0
        loss = task + w.lambda_priv * adv + w.lambda_fair * unc
        record = {**parts, "task": task.detach(), "adv": adv.detach(), "unc": unc.detach()}
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
        for k, v in record.items():
            self._loss_sums[k] = self._loss_sums.get(k, 0.0) + float(v)
        self._loss_count += 1
        if self._fabric is not None and self._fabric.loggers:
            self.log_dict({f"step/client_{self.client_id}/{k}": float(v) for k, v in record.items()})

    def mean_losses(self) -> dict[str, float]:
        n = max(self._loss_count, 1)
        return {k: v / n for k, v in self._loss_sums.items()}

    def report_u(self, ufm_raw: float, utility: float, ema_prev: float) -> tuple[float, float, bool]:
        """EMA -> clip -> gate (SPEC §3). Returns (new EMA state, reported u, gated)."""
        u = self.ufm
        prev = None if math.isnan(ema_prev) else ema_prev
        rep = reported_ufm(ufm_raw, utility, clip=(u.clip_low, u.clip_high), gate_map=u.gate,
                           ema_prev=prev, ema_decay=u.ema_decay)
        return (math.nan if rep.ema is None else rep.ema), rep.u, utility < u.gate
