"""PrivFairFL-Pre and PrivFairFL-Post (docs/method.md §5), as this project reads them.

Pre (client side, before upload): the update of the logit layer (the layer that maps features to the Dirichlet
logits) is clipped to an l2 bound and Gaussian noise is added (the Gaussian mechanism on the part of the update that
shapes the logits); then a temperature T fitted on the client's validation split is folded into that layer (z -> z/T),
so the noisy logits are re-calibrated before the update is taken. Local training adds L_fair.

Post (server side): training is unchanged (FedAvg). Each client reports, in ClientReport.extras, aggregate
counts from its validation split: the summed binary NLL of its scores at each temperature of a fixed grid, and per
group the number of positives (tabular: y = 1 rows; detection: ground-truth persons) whose score reaches each
threshold of a fixed grid. No score, label or group of an individual sample leaves the client. From the sums the
server picks one temperature (scaling the score's log-odds, c = sigmoid(logit(p) / T), a rank-preserving map) and
per-group thresholds that bring each group's TPR to the pooled TPR at the default threshold, smoothed toward the
default threshold (t_g = (1 - rho) tau + rho t_g*) so small groups do not chase noise. The calibrated decision rule
(global model + T + t_g) is what the test metrics evaluate; like every group-threshold post-processing it needs the
sensitive attribute at decision time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from resfl_lightning.clients.plugin import ClientPlugin
from resfl_lightning.config import rules
from resfl_lightning.config.fields import Section, setting
from resfl_lightning.losses.evidential import dirichlet_alpha, dirichlet_nll
from resfl_lightning.metrics.eod import classification_eod, detection_eod, detection_group_rates
from resfl_lightning.metrics.fairness import (
    classification_fairness,
    disparate_impact,
    equal_opportunity_difference,
    fairness_score,
    group_tpr,
    match_image_groups,
)
from resfl_lightning.metrics.group_size import without_groups

EPS = 1e-6
CALIBRATION_KEY = "calibration"  # ClientReport.extras: a client's PrivFairFL-Post counts and sums


def _grid(low: float, high: float, num: int) -> tuple[float, ...]:
    return tuple(float(t) for t in torch.logspace(math.log10(low), math.log10(high), num, dtype=torch.float64))


# ---- PrivFairFL-Pre ------------------------------------------------------------------------------------------


@dataclass(kw_only=True, frozen=True)
class LogitPrivacySettings(Section):
    """`algorithm.logit_privacy`: clip bound and noise multiplier for the logit layer's update, temperature grid."""

    section = "algorithm.logit_privacy"
    checks = (rules.temperature_grid_nonempty,)

    clip: float = setting(1.0, "L2 clip of the logit layer's update before upload", gt=0)
    noise_multiplier: float = setting(1.0, "Gaussian noise std as a multiple of clip", ge=0)
    calibrate: bool = setting(True, "fold a temperature fitted on the client's validation split into the layer")
    temperatures: tuple[float, ...] = setting(_grid(0.25, 4.0, 25), "temperature grid of the fit", gt=0)


def logit_layers(client) -> list[nn.Module]:
    """The layers that output the Dirichlet logits: the detector's class-branch output convs, TabularNet's head."""
    model = client.model
    if hasattr(model, "detector"):
        return [branch[-1] for branch in model.detector.model[-1].cv3]
    return [model.head]


@torch.no_grad()
def fit_temperature(client, loader, temperatures: tuple[float, ...]) -> float:
    """argmin over the grid of the validation Dirichlet NLL with logits z / T (the task's own classification loss)."""
    was_training = client.training
    client.eval()
    totals = torch.zeros(len(temperatures), dtype=torch.float64)
    for batch in loader:
        batch = client.place(batch)
        if hasattr(client, "criterion"):  # detection: the criterion's Dirichlet NLL over assigned anchors
            out = client.model(batch["img"])
            for k, t in enumerate(temperatures):
                totals[k] += float(client.criterion.compute({**out, "scores": out["scores"] / t}, batch).parts["cls"])
        else:
            logits = client.model(batch["x"]).logits
            onehot = F.one_hot(batch["y"], logits.shape[-1]).to(logits.dtype)
            for k, t in enumerate(temperatures):
                totals[k] += float(dirichlet_nll(dirichlet_alpha(logits / t), onehot).sum())
    client.train(was_training)
    return float(temperatures[int(torch.argmin(totals))])


class PerturbCalibrate(ClientPlugin):
    """PrivFairFL-Pre's pre-upload step on the live client module (see the module docstring), a client plug-in."""

    def __init__(self, settings: LogitPrivacySettings):
        self.settings = settings
        self._start: list[torch.Tensor] | None = None
        self.last_temperature = math.nan

    def _params(self, client) -> list[torch.Tensor]:
        return [p for layer in logit_layers(client) for p in layer.parameters()]

    def begin_round(self, client) -> None:
        """The round's starting logit layer (theta_G's), against which the update is clipped."""
        self._start = [p.detach().clone() for p in self._params(client)]

    @torch.no_grad()
    def before_upload(self, client, val_loader) -> None:
        if self._start is None:
            raise RuntimeError(f"client {client.client_id}: PerturbCalibrate.before_upload before begin_round")
        s = self.settings
        params = self._params(client)
        deltas = [p - p0 for p, p0 in zip(params, self._start)]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(d) for d in deltas]))
        scale = min(1.0, s.clip / (float(norm) + 1e-12))
        for p, p0, d in zip(params, self._start, deltas):  # noise from the client's seeded RNG
            p.copy_(p0 + d * scale + torch.randn_like(p) * (s.noise_multiplier * s.clip))
        if s.calibrate:
            t = fit_temperature(client, val_loader, s.temperatures)
            for p in params:  # z = W h + b  ->  z / T
                p.div_(t)
            self.last_temperature = t


# ---- PrivFairFL-Post -----------------------------------------------------------------------------------------


@dataclass(kw_only=True, frozen=True)
class PostCalibrationSettings(Section):
    """`algorithm.post_calibration`: grids the clients report on and the server's smoothing."""

    section = "algorithm.post_calibration"
    checks = (rules.temperature_grid_nonempty,)

    temperatures: tuple[float, ...] = setting(_grid(0.25, 4.0, 25), "temperature grid the server fits on", gt=0)
    num_thresholds: int = setting(101, "raw-score grid 0, 0.01, ..., 1 the clients count positives on", ge=2)
    smoothing: float = setting(0.5, "rho: t_g = (1 - rho) tau + rho t_g*", ge=0, le=1)
    min_positives: int = setting(20, "groups with fewer positives (all clients) keep the default threshold", ge=1)

    @property
    def raw_grid(self) -> torch.Tensor:
        return torch.linspace(0.0, 1.0, self.num_thresholds, dtype=torch.float64)


def calibrate_scores(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """c = sigmoid(logit(p) / T): temperature scaling of the score's log-odds (rank-preserving)."""
    p = scores.double().clamp(EPS, 1 - EPS)
    return torch.sigmoid(torch.logit(p) / temperature)


def _detection_samples(client, loader):
    """(score, is-true-detection) per post-NMS detection and (group, matched score or 0) per ground-truth person."""
    preds, gts, _ = client.collect(loader)
    scores, labels, pos_groups, pos_scores = [], [], [], []
    for idx, pair in enumerate(zip(preds, gts)):
        groups, pred_to_gt, _ = match_image_groups(pair, idx, client.num_groups, client.ufm.iou_threshold, 0.0)
        s = pair[0]["scores"].double()
        scores.append(s)
        labels.append((pred_to_gt >= 0).double())
        matched = torch.zeros(groups.shape[0], dtype=torch.float64)
        hit = pred_to_gt >= 0
        matched[pred_to_gt[hit]] = s[hit]  # greedy by score: thresholding keeps a prefix of this matching
        pos_groups.append(groups)
        pos_scores.append(matched)
    return torch.cat(scores), torch.cat(labels), torch.cat(pos_groups), torch.cat(pos_scores)


def _tabular_samples(client, loader):
    pred = client.collect(loader)
    if pred.alpha.shape[-1] != 2:
        raise ValueError(f"algorithm.post_calibration: needs a binary task, the model has {pred.alpha.shape[-1]} "
                         "classes")
    p = pred.probs[:, 1].double()
    y = pred.y.double()
    positive = pred.y == 1
    return p, y, pred.groups[positive].long(), p[positive]


class CalibrationStatistics(ClientPlugin):
    """Client side of PrivFairFL-Post, a client plug-in: the aggregate counts a client reports (CALIBRATION_KEY)."""

    def __init__(self, settings: PostCalibrationSettings):
        self.settings = settings

    def report(self, client, val_loader) -> dict[str, dict[str, float]]:
        return {CALIBRATION_KEY: self.statistics(client, val_loader)}

    def statistics(self, client, val_loader) -> dict[str, float]:
        s = self.settings
        sampler = _detection_samples if hasattr(client, "criterion") else _tabular_samples
        scores, labels, pos_groups, pos_scores = sampler(client, val_loader)
        out = {"n": float(scores.numel())}
        for k, t in enumerate(s.temperatures):
            c = calibrate_scores(scores, t)
            out[f"nll/{k}"] = float(F.binary_cross_entropy(c, labels, reduction="sum")) if scores.numel() else 0.0
        grid = s.raw_grid
        for g in range(client.num_groups):
            sg = pos_scores[pos_groups == g]
            out[f"pos/{g}"] = float(sg.numel())
            reached = (sg[:, None] >= grid[None, :]).sum(0)
            out.update({f"pos/{g}/{k}": float(v) for k, v in enumerate(reached.tolist())})
        return out


@dataclass(frozen=True)
class Calibration:
    temperature: float
    thresholds: dict[int, float]  # calibrated-score threshold per group
    default: float  # calibrate(tau, T): the raw operating point tau on the calibrated scale, for unknown groups

    def as_metrics(self) -> dict[str, float]:
        out = {"calibration/temperature": self.temperature}
        out.update({f"calibration/threshold/{g}": t for g, t in self.thresholds.items()})
        return out


def fit_post_calibration(reports, settings: PostCalibrationSettings, num_groups: int, tau: float) -> Calibration:
    """Server side: temperature and smoothed per-group thresholds from the clients' reported sums only.

    tau is the raw-score operating point every other method is evaluated at. Temperature scaling alone must not
    move it (it is rank-preserving, and the comparison isolates the per-group thresholds), so the calibrated rule's
    default threshold is calibrate(tau, T) and the target TPR is the pooled TPR at raw tau. (For a binary classifier
    at tau = 0.5, calibrate(0.5, T) = 0.5 for every T.)"""
    stats = [r.extras.get(CALIBRATION_KEY) for r in reports]
    if not stats or any(not st for st in stats):
        missing = [r.client_id for r in reports if not r.extras.get(CALIBRATION_KEY)]
        raise ValueError(f"post calibration: clients {missing} reported no calibration statistics")
    n = sum(st["n"] for st in stats)
    temps = settings.temperatures
    if n > 0:
        nll = [sum(st[f"nll/{k}"] for st in stats) for k in range(len(temps))]
        temperature = float(temps[min(range(len(temps)), key=nll.__getitem__)])
    else:
        temperature = 1.0
    tau_cal = float(calibrate_scores(torch.tensor([tau], dtype=torch.float64), temperature)[0])
    grid = settings.raw_grid
    totals = {g: sum(st[f"pos/{g}"] for st in stats) for g in range(num_groups)}
    curves = {g: torch.tensor([sum(st[f"pos/{g}/{k}"] for st in stats) for k in range(len(grid))],
                              dtype=torch.float64) for g in range(num_groups)}
    all_pos = sum(totals.values())
    thresholds = {g: tau_cal for g in range(num_groups)}
    if all_pos == 0:
        return Calibration(temperature, thresholds, tau_cal)
    k_tau = int((grid <= tau + 1e-12).nonzero().max())
    target = float(sum(curves[g][k_tau] for g in curves) / all_pos)
    for g in range(num_groups):
        if totals[g] < settings.min_positives:
            continue
        gap = (curves[g] / totals[g] - target).abs()
        best = gap.min()
        candidates = (gap <= best + 1e-12).nonzero().flatten()
        k_g = int(candidates[(candidates - k_tau).abs().argmin()])  # ties: the threshold nearest tau's
        t_star = float(calibrate_scores(grid[k_g:k_g + 1], temperature)[0]) if 0 < k_g < len(grid) - 1 \
            else float(grid[k_g])
        thresholds[g] = (1 - settings.smoothing) * tau_cal + settings.smoothing * t_star
    return Calibration(temperature, thresholds, tau_cal)


def _threshold_per(groups: torch.Tensor, cal: Calibration) -> torch.Tensor:
    thr = torch.full(groups.shape, cal.default, dtype=torch.float64)
    for g, t in cal.thresholds.items():
        thr[groups == g] = t
    return thr


def calibrated_classification_metrics(pred, cal: Calibration, excluded: Mapping[int, int] | None = None
                                      ) -> dict[str, float]:
    """classification_fairness of the calibrated rule: y_hat = 1 iff sigmoid(logit(p1) / T) >= t_group. The rule
    reads every row's own group; the groups in `excluded` (below metrics.min_group_size) are left out of the
    group metrics only."""
    c = calibrate_scores(pred.probs[:, 1], cal.temperature)
    y_hat = (c >= _threshold_per(pred.groups.long(), cal)).long()
    return classification_fairness(pred.y, y_hat, without_groups(pred.groups, excluded))


def calibrated_pairs(preds: list[dict], gts: list[dict], cal: Calibration) -> list[tuple[dict, dict]]:
    """(prediction with calibrated scores, ground truth) per image: the scores the calibrated rule thresholds."""
    return [({**p, "scores": calibrate_scores(p["scores"], cal.temperature)}, g) for p, g in zip(preds, gts)]


def group_thresholds(cal: Calibration, num_groups: int) -> list[float]:
    return [cal.thresholds[g] if g in cal.thresholds else cal.default for g in range(num_groups)]


def calibrated_detection_metrics(preds: list[dict], gts: list[dict], cal: Calibration, num_groups: int,
                                 iou_threshold: float) -> dict[str, float]:
    """Group TPR, DI, delta-EOP, Fairness Score when a person of group g counts as found iff its matched detection's
    calibrated score reaches t_g (mAP is unchanged: the calibration preserves every image's score order)."""
    c = detection_group_rates(calibrated_pairs(preds, gts, cal), num_groups, iou_threshold, cal.default,
                              group_thresholds(cal, num_groups))
    rates = group_tpr(c["tp"], c["fn"])
    tpr = {g: float(r) for g, r in enumerate(rates.tolist()) if not math.isnan(r)}
    arr = list(tpr.values())
    di, eop = disparate_impact(arr), equal_opportunity_difference(arr)
    out = {f"tpr/{g}": v for g, v in tpr.items()}
    out.update(di=di, abs_one_minus_di=abs(1.0 - di), delta_eop=eop, fairness_score=fairness_score(di, eop))
    return out


def calibrated_eod(outputs, cal: Calibration, num_groups: int, protected: int, unprotected: int | None,
                   iou_threshold: float | None = None, excluded: Mapping[int, int] | None = None
                   ) -> dict[str, float]:
    """EOD (metrics/eod.py) of the calibrated rule: detection when `outputs` is (preds, gts, ...), else the tabular
    predictions with y_hat = 1 iff the calibrated p1 reaches its group's threshold. The groups in `excluded` are
    left out of both sides (a detection person of one is never counted, whatever its threshold)."""
    if isinstance(outputs, tuple):
        preds, gts = outputs[0], outputs[1]
        if excluded:
            gts = [{**g, "groups": without_groups(g["groups"], excluded)} for g in gts]
        return detection_eod(calibrated_pairs(preds, gts, cal), num_groups, protected, unprotected,
                             iou_threshold=iou_threshold, score_threshold=cal.default,
                             group_thresholds=group_thresholds(cal, num_groups))
    c = calibrate_scores(outputs.probs[:, 1], cal.temperature)
    y_hat = (c >= _threshold_per(outputs.groups.long(), cal)).long()
    return classification_eod(outputs.y, y_hat, without_groups(outputs.groups, excluded), num_groups, protected,
                              unprotected)
