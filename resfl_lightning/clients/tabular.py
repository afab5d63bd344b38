"""RESFL classification client: evidential TabularNet + GRL adversary on the penultimate features
(docs/method.md §1-3, §8).

Batches are dicts {"x": float (B, F), "y": long (B,), "groups": long (B,) (-1 = unknown), "index": long (B,)}.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from resfl_lightning.clients.base import (
    AdversarySettings,
    EvalResult,
    FederatedClient,
    LossWeights,
    OptimSettings,
    UfmSettings,
)
from resfl_lightning.clients.cohorts import effective_mode
from resfl_lightning.clients.identity import cohort_seed
from resfl_lightning.losses.adversary import Adversary
from resfl_lightning.losses.evidential import dirichlet_kl_uniform, dirichlet_nll
from resfl_lightning.losses.fairness import group_mean_distance
from resfl_lightning.losses.parity import prediction_mass, prediction_parity_gap
from resfl_lightning.metrics.fairness import classification_fairness
from resfl_lightning.metrics.ufm import (
    UFMResult,
    cohorts_kmeans,
    cohorts_vacuity_slices,
    drop_group_labels,
    drop_small_cohorts,
    flip_group_labels,
    insufficient_ufm,
    ufm_from_samples,
)
from resfl_lightning.models.tabular import TabularNet


@dataclass
class TabularPredictions:
    """Eval-mode outputs for every row of a loader (CPU tensors), in loader order."""

    alpha: torch.Tensor  # (N, C) Dirichlet concentrations
    features: torch.Tensor  # (N, d) penultimate h
    losses: torch.Tensor  # (N,) Dirichlet NLL
    y: torch.Tensor  # (N,)
    groups: torch.Tensor  # (N,)
    index: torch.Tensor  # (N,) global row index

    @property
    def alpha0(self) -> torch.Tensor:
        return self.alpha.sum(dim=-1)

    @property
    def probs(self) -> torch.Tensor:
        return self.alpha / self.alpha0.unsqueeze(-1)

    @property
    def y_pred(self) -> torch.Tensor:
        return self.alpha.argmax(dim=-1)

    @property
    def accuracy(self) -> float:
        return float((self.y_pred == self.y).double().mean()) if self.y.numel() else float("nan")


def one_hot_on_device(y: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """F.one_hot(y, num_classes).to(dtype), the same values, without the host read of y's range that F.one_hot makes
    on a non-CUDA device (the training step checks labels on the device instead; FederatedClient.check_batch)."""
    return (y.unsqueeze(-1) == torch.arange(num_classes, device=y.device)).to(dtype)


class TabularClient(FederatedClient):
    def __init__(self, num_features: int, num_groups: int, weights: LossWeights, ufm: UfmSettings,
                 optim: OptimSettings, hidden: Sequence[int] = (256, 128, 64), num_classes: int = 2,
                 adversary: AdversarySettings | None = None, row_weights: torch.Tensor | None = None):
        super().__init__(weights, ufm, optim, adversary)
        self.num_groups, self.num_classes = num_groups, num_classes
        # Kamiran-Calders weight of every row (data/reweighing.py), looked up by the batch's `index`; None: off.
        # A plain attribute, not a buffer: it stays out of the state dict and the checkpoint.
        self.row_weights = row_weights
        self.model = TabularNet(num_features, hidden, num_classes)
        self.adversary = Adversary(self.model.feature_dim, num_groups, hidden=self.adversary_settings.hidden,
                                   grl_scale=self.reversal_scale, depth=self.adversary_settings.depth)

    def curvature_parameters(self) -> list[torch.nn.Parameter]:
        return self.model.head_parameters if self.weights.curv_params == "head" else list(self.model.parameters())

    def _check_shapes(self, batch: dict) -> None:
        x, y = batch["x"], batch["y"]
        if y.shape != (x.shape[0],) or batch["groups"].shape != y.shape:
            raise ValueError(f"tabular batch: x {tuple(x.shape)}, y {tuple(y.shape)} and groups "
                             f"{tuple(batch['groups'].shape)} must share the batch dimension")

    def _check_batch(self, batch: dict) -> None:
        """Shapes and label range, read on the host (evaluation: its outputs are read back per batch anyway)."""
        self._check_shapes(batch)
        y = batch["y"]
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise ValueError(f"tabular batch: labels must lie in 0..{self.num_classes - 1}, got {y.unique().tolist()}")

    def _checked_labels(self, y: torch.Tensor, batch_idx: int) -> torch.Tensor:
        """The training step's label check, on the device (the local loop raises at the epoch's end, naming client
        and batch); meanwhile a bad label is clamped so that it never reaches one_hot, where a GPU would stop on a
        device-side assert."""
        c = self.num_classes
        if y.numel():
            self.check_batch(((y < 0) | (y >= c)).any(), batch_idx,
                             f"tabular batch: labels must lie in 0..{c - 1}, got min, max",
                             detail=torch.stack([y.min(), y.max()]))
        return y.clamp(0, c - 1)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self._check_shapes(batch)  # shapes only: no host read per step
        out = self.model(batch["x"])
        y, groups = self._checked_labels(batch["y"], batch_idx), batch["groups"]
        onehot = one_hot_on_device(y, self.num_classes, out.alpha.dtype)
        nll = dirichlet_nll(out.alpha, onehot)
        task = nll.mean() if self.row_weights is None else (self._sample_weights(batch["index"], nll) * nll).mean()
        adv = self.adversary_loss(out.features, groups, batch_idx) if self.weights.lambda_priv > 0 else task * 0.0
        kl = dirichlet_kl_uniform(out.alpha, onehot)
        correct = out.alpha.argmax(dim=-1) == y
        parts = {"kl": kl.mean().detach(), "train_acc": correct.float().mean()}
        fair = group_mean_distance(out.features, groups) if self.weights.w_fair > 0 else None
        terms = self.plugin_terms(out, batch)
        # CurvFed's Fisher is over the correctly classified samples; indexing keeps the graph to theta. Only when the
        # curvature term is on: a boolean mask's data-dependent shape is a host synchronisation on a GPU.
        fisher = nll[correct] if self.weights.lambda_curv > 0 else None
        return self.compose_loss(task, adv, self.kl_coefficient() * kl, groups, fisher, parts, fair=fair,
                                 terms=terms)

    def _sample_weights(self, index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The batch rows' reweighing weights; a plain mean of w_i l_i (Σ w = n over the training split keeps the
        loss scale), so opacus' per-example gradients are w_i times the unweighted ones."""
        if self.row_weights.device != index.device:
            self.row_weights = self.row_weights.to(index.device)
        return self.row_weights[index].to(like.dtype)

    @torch.no_grad()
    def collect(self, loader) -> TabularPredictions:
        """Eval-mode Dirichlet outputs, features and per-sample NLL for a whole loader."""
        was_training = self.training
        self.eval()
        cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("alpha", "features", "losses", "y", "groups", "index")}
        for batch in loader:
            batch = self.place(batch)
            self._check_batch(batch)
            out = self.model(batch["x"])
            onehot = F.one_hot(batch["y"], self.num_classes).to(out.alpha.dtype)
            values = {"alpha": out.alpha, "features": out.features, "losses": dirichlet_nll(out.alpha, onehot),
                      "y": batch["y"], "groups": batch["groups"], "index": batch["index"]}
            for k, v in values.items():
                cols[k].append(v.detach().float().cpu() if v.is_floating_point() else v.detach().cpu())
        self.train(was_training)
        if not cols["y"]:
            raise ValueError("TabularClient.collect: the loader yielded no batches")
        return TabularPredictions(**{k: torch.cat(v) for k, v in cols.items()})

    def ufm_cohorts(self, pred: TabularPredictions) -> torch.Tensor:
        """Per-sample cohort ids for UFM (docs/method.md §3): the true groups, partial / noisy groups, or label-free
        cohorts."""
        u = self.ufm
        mode = effective_mode(u)
        seed = cohort_seed(self.client_id, self.round_idx)  # the detection client's seeding, so runs stay comparable
        if mode == "groups":
            groups = pred.groups
            if u.flip_rate > 0:
                groups = flip_group_labels(groups, u.flip_rate, self.num_groups, seed)
            if u.drop_fraction > 0:
                groups = drop_group_labels(groups, u.drop_fraction, seed + 1)
            return groups
        n = pred.y.numel()
        if mode == "cluster":
            return cohorts_kmeans(pred.features, min(u.num_cohorts, n), seed)
        if mode == "slices":
            return cohorts_vacuity_slices(1.0 / pred.alpha0.double(), min(u.num_cohorts, n))
        raise ValueError(f"ufm.cohorts={u.cohorts!r} needs a proxy column, which tabular data does not provide; "
                         "use groups, cluster or slices")

    def _ufm_cohorts_kept(self, pred: TabularPredictions) -> torch.Tensor | None:
        cohorts, kept = drop_small_cohorts(self.ufm_cohorts(pred), self.ufm.min_group_persons)
        return cohorts if kept >= 2 else None

    def _ufm(self, pred: TabularPredictions, cohorts: torch.Tensor | None = None) -> UFMResult:
        """UFM over `cohorts` (computed here when not given; None after `_ufm_cohorts_kept` = too few groups)."""
        if cohorts is None:
            cohorts = self._ufm_cohorts_kept(pred)
        if cohorts is None:
            return insufficient_ufm()
        return ufm_from_samples(pred.alpha0, cohorts, evidence_floor=self.ufm.evidence_floor, eps=self.ufm.eps)

    def evaluate(self, loader) -> EvalResult:
        """UFM over the per-sample Dirichlet strength alpha_0 by cohort; utility = accuracy (gated like mAP)."""
        pred = self.collect(loader)
        acc = pred.accuracy
        cohorts = self._ufm_cohorts_kept(pred)  # once: label-free cohorts (k-means) are not recomputed for the UFM
        units = None if cohorts is None else [{int(g): float(a)} for g, a in zip(cohorts, pred.alpha0) if g >= 0]
        ufm = math.nan if cohorts is None else self._ufm(pred, cohorts).ufm
        fair = classification_fairness(pred.y, pred.y_pred, pred.groups)
        return EvalResult(ufm_raw=float(ufm), utility=acc, utility50=acc,
                          eval_loss=float(pred.losses.mean()), ufm_se=self._ufm_se(units),
                          val_delta_eop=float(fair["delta_eop"]))

    def test_outputs(self, loader) -> TabularPredictions:
        """One eval-mode pass over a split: every metric of an evaluation round is computed from it."""
        return self.collect(loader)

    def test_metrics(self, loader) -> dict[str, float]:
        return self.test_metrics_from(self.test_outputs(loader))

    def test_metrics_from(self, pred: TabularPredictions) -> dict[str, float]:
        """Accuracy, per-group selection rate / TPR / FPR, |1-DI| (selection rate), delta-EOP, EO gap, UFM, loss."""
        out = classification_fairness(pred.y, pred.y_pred, pred.groups)
        out.update(self._ufm(pred).as_dict())
        out["loss"] = float(pred.losses.mean())
        return out

    def group_outcomes(self, loader, num_groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pred = self.collect(loader)
        positive, known = pred.y == 1, pred.groups >= 0
        hit = positive & (pred.y_pred == 1)
        accuracy = torch.tensor([int((pred.y_pred == pred.y).sum()), pred.y.numel()])
        return (torch.bincount(pred.groups[hit & known], minlength=num_groups),
                torch.bincount(pred.groups[positive & known], minlength=num_groups), accuracy)

    def bn_forward(self, batch: dict) -> None:
        self.model(self.place(batch)["x"])

    def parity_gap(self, out, batch: dict, rates: torch.Tensor | None) -> torch.Tensor:
        """PUFFLE's gap of the step's predictions (clients/parity_term.py); an absent group is compared through the
        server's P(k|z) `rates` when given."""
        return prediction_parity_gap(out.logits, batch["groups"], rates)

    def parity_mass(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return prediction_mass(self.model(batch["x"]).logits), batch["groups"]

    def per_sample_losses(self, batch: dict) -> torch.Tensor:
        """Per-row Dirichlet NLL."""
        out = self.model(batch["x"])
        return dirichlet_nll(out.alpha, F.one_hot(batch["y"], self.num_classes).to(out.alpha.dtype))
