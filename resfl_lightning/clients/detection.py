"""RESFL detection client: evidential YOLOv8 + GRL adversary on ROI-pooled neck features (docs/method.md §1-3)."""

from __future__ import annotations

import math

import torch

from resfl_lightning.clients.base import (
    AdversarySettings,
    EvalResult,
    FederatedClient,
    LossWeights,
    OptimSettings,
    UfmSettings,
)
from resfl_lightning.clients.cohorts import effective_mode, ufm_cohorts
from resfl_lightning.clients.identity import cohort_seed
from resfl_lightning.data.detection import ground_truth_for
from resfl_lightning.losses.adversary import Adversary, roi_pool_features
from resfl_lightning.losses.detection import EvidentialDetectionLoss
from resfl_lightning.losses.fairness import group_mean_distance
from resfl_lightning.losses.parity import detection_mass, detection_parity_gap, person_scores
from resfl_lightning.losses.per_image import per_image_detection_loss
from resfl_lightning.metrics.detection import detection_map
from resfl_lightning.metrics.fairness import detection_fairness, group_counts
from resfl_lightning.metrics.matching import match_pred_gt
from resfl_lightning.metrics.ufm import (
    drop_small_cohorts,
    image_group_evidence,
    insufficient_ufm,
    ufm_from_units,
)
from resfl_lightning.models.yolo import EvidentialYOLO, YoloSpec


def gt_boxes_xyxy(batch: dict, image_hw: tuple[int, int]) -> torch.Tensor:
    """Normalised xywh ground truth -> pixel xyxy."""
    h, w = image_hw
    xywh = batch["bboxes"] * batch["bboxes"].new_tensor([w, h, w, h])
    return torch.cat([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], dim=1)


def images_all_found(preds: list[dict], gts: list[dict], iou_threshold: float, score_threshold: float) -> torch.Tensor:
    """(B,) bool: the image holds at least one person and every one is matched (IoU >= iou_threshold, score >=
    score_threshold): CurvFed's "correctly classified" sample for detection (docs/method.md §5a)."""
    return torch.tensor([gt["boxes"].shape[0] > 0
                         and bool(match_pred_gt(pred, gt, iou_threshold, score_threshold)[1].all())
                         for pred, gt in zip(preds, gts)], dtype=torch.bool)


class DetectionClient(FederatedClient):
    def __init__(self, spec: YoloSpec, num_groups: int, weights: LossWeights, ufm: UfmSettings,
                 optim: OptimSettings, adversary: AdversarySettings | None = None, map_conf: float = 0.001,
                 max_det: int = 300):
        super().__init__(weights, ufm, optim, adversary)
        self.spec, self.num_groups = spec, num_groups
        self.model = EvidentialYOLO(spec)
        self.adversary = Adversary(sum(self.model.feature_channels), num_groups,
                                   hidden=self.adversary_settings.hidden, grl_scale=self.reversal_scale,
                                   depth=self.adversary_settings.depth)
        self.criterion = EvidentialDetectionLoss(self.model)
        self.map_conf, self.max_det = map_conf, max_det
        self._strides = [int(s) for s in self.model.strides.tolist()]  # fixed by the architecture: read once here

    def curvature_parameters(self) -> list[torch.nn.Parameter]:
        return self.model.head_parameters if self.weights.curv_params == "head" else list(self.model.parameters())

    def person_features(self, feats: list[torch.Tensor], batch: dict) -> torch.Tensor:
        """h: neck features ROI-aligned at each ground-truth person box and average-pooled (one row per person)."""
        image_hw = tuple(batch["img"].shape[2:])
        boxes = gt_boxes_xyxy(batch, image_hw)
        # batch_idx comes from detection_collate (0..B-1 by construction): no per-step host check of its range.
        a = self.adversary_settings
        return roi_pool_features(feats, self._strides, boxes, batch["batch_idx"].long(), output_size=a.roi_bins,
                                 sampling_ratio=a.roi_samples, check_batch_idx=False, impl=a.roi_impl)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.model(batch["img"])
        # Under DP-SGD every image's loss stands alone (per-example sensitivity; losses/per_image.py).
        res = per_image_detection_loss(self.criterion, out, batch) if self.per_example_loss else \
            self.criterion.compute(out, batch)
        w = self.weights
        has_persons = bool(batch["groups"].numel())
        h = self.person_features(out["feats"], batch) if has_persons and (w.lambda_priv > 0 or w.w_fair > 0) \
            else None
        if w.lambda_priv > 0 and has_persons:
            adv = self.adversary_loss(h, batch["groups"], batch_idx)
        else:
            adv = res.task * 0.0
        fair = None
        if w.w_fair > 0:  # L_fair on the ROI-pooled person features the adversary uses
            fair = group_mean_distance(h, batch["groups"]) if h is not None else res.task * 0.0
        terms = self.plugin_terms(out, batch)
        unc_values = self.kl_coefficient() * res.fg_unc + res.fg_nig_reg
        fisher = None
        if w.lambda_curv > 0:  # no NMS for the correct images on a step the refreshed term skips
            fisher = res.per_image_cls[self.correct_images(out, batch)] if self.curvature.due() else \
                res.per_image_cls[:0]
        return self.compose_loss(res.task, adv, unc_values, res.fg_groups, fisher, res.parts, fair=fair,
                                 terms=terms)

    def parity_gap(self, out: dict, batch: dict, rates: torch.Tensor | None) -> torch.Tensor:
        """PUFFLE's gap for detection (docs/method.md §5a, our reading; clients/parity_term.py): per ground-truth
        person the best score of its class among the predictions overlapping it at IoU >= ufm.iou_threshold (0 if
        none), counted as detected at score >= ufm.score_threshold; the gap over groups of the detected mass, an
        absent group compared through the server's P(k|z) `rates` when given."""
        return detection_parity_gap(self._person_scores(out, batch), batch["groups"], self.ufm.score_threshold,
                                    rates)

    def parity_mass(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(batch["img"])
        return detection_mass(self._person_scores(out, batch), self.ufm.score_threshold), batch["groups"]

    def _person_scores(self, out: dict, batch: dict) -> torch.Tensor:
        dec = self.model.decode(out)
        alpha = dec["alpha"]
        probs = alpha[..., : self.model.num_classes] / alpha.sum(-1, keepdim=True)
        gt = gt_boxes_xyxy(batch, tuple(batch["img"].shape[2:]))
        return person_scores(dec["boxes"].detach(), probs, gt, batch["batch_idx"], batch["cls"].reshape(-1),
                             self.ufm.iou_threshold)

    def correct_images(self, out: dict, batch: dict) -> torch.Tensor:
        """CurvFed's Fisher samples of this step's forward pass: images whose persons are all detected."""
        u = self.ufm
        preds = self.model.predict(out, conf=u.score_threshold, iou=u.iou_threshold, max_det=self.max_det)
        found = images_all_found(preds, ground_truth_for(batch), u.iou_threshold, u.score_threshold)
        return found.to(out["feats"][0].device)

    @torch.no_grad()
    def predict_batch(self, batch: dict, with_features: bool = False):
        """Post-NMS predictions, ground truth and the task loss of one batch (+ per-person features if asked)."""
        out = self.model(batch["img"])
        preds = self.model.predict(out, conf=self.map_conf, iou=self.ufm.iou_threshold, max_det=self.max_det)
        gts = ground_truth_for(batch)
        loss = self.criterion.compute(out, batch).task
        if not with_features:
            return preds, gts, loss
        feats = self.person_features(out["feats"], batch)
        owner = batch["batch_idx"].long()
        return preds, gts, loss, [feats[owner == i] for i in range(len(gts))]

    def collect(self, loader, with_features: bool = False):
        """Eval-mode predictions and ground truth for a whole loader, the mean task loss (and person features)."""
        was_training = self.training
        self.eval()
        preds, gts, losses, feats = [], [], [], []
        for batch in loader:
            batch = self.place(batch)
            p, g, loss, *f = self.predict_batch(batch, with_features)
            preds += [{k: v.cpu() for k, v in d.items()} for d in p]
            gts += [{k: v.cpu() for k, v in d.items()} for d in g]
            feats += [x.cpu() for x in f[0]] if f else []
            losses.append(float(loss))
        self.train(was_training)
        mean_loss = sum(losses) / max(len(losses), 1)
        return (preds, gts, mean_loss, feats) if with_features else (preds, gts, mean_loss)

    def _collect_for_ufm(self, loader):
        needs_features = effective_mode(self.ufm) == "cluster"
        preds, gts, loss, *feats = self.collect(loader, with_features=needs_features)
        return preds, gts, loss, (feats[0] if feats else None)

    def _ufm(self, preds: list[dict], gts: list[dict], features=None):
        units = self.ufm_units(preds, gts, features)
        if units is None:
            return insufficient_ufm()
        return ufm_from_units(units, evidence_floor=self.ufm.evidence_floor, eps=self.ufm.eps)

    def ufm_units(self, preds: list[dict], gts: list[dict], features=None) -> list[dict[int, float]] | None:
        """Per-image group evidence over the UFM cohorts, or None when fewer than two cohorts are usable."""
        u = self.ufm
        cohorts = ufm_cohorts(preds, gts, u, self.num_groups, seed=cohort_seed(self.client_id, self.round_idx),
                              features=features)
        per_image = cohorts if cohorts is not None else [g["groups"].long().cpu() for g in gts]
        flat, kept = drop_small_cohorts(torch.cat(per_image) if per_image else torch.empty(0), u.min_group_persons)
        if kept < 2:
            return None
        cohorts = list(flat.split([len(c) for c in per_image]))
        return image_group_evidence(list(zip(preds, gts)), cohorts=cohorts, score_threshold=u.score_threshold,
                                    iou_threshold=u.iou_threshold)

    def evaluate(self, loader) -> EvalResult:
        preds, gts, loss, feats = self._collect_for_ufm(loader)
        ap = detection_map(preds, gts)
        units = self.ufm_units(preds, gts, feats)
        u = self.ufm
        fair = detection_fairness(list(zip(preds, gts)), self.num_groups, iou_threshold=u.iou_threshold,
                                  score_threshold=u.score_threshold)
        return EvalResult(ufm_raw=math.nan if units is None else ufm_from_units(units, u.evidence_floor, u.eps).ufm,
                          utility=float(ap["map"]), utility50=float(ap["map_50"]), eval_loss=loss,
                          ufm_se=self._ufm_se(units), val_delta_eop=float(fair["delta_eop"]))

    def test_outputs(self, loader):
        """One eval-mode pass over a split, (preds, gts, mean task loss, person features or None): every metric of
        an evaluation round is computed from it (test_metrics_from, EOD in attacks/robustness_attacks.py)."""
        return self._collect_for_ufm(loader)

    def test_metrics(self, loader) -> dict[str, float]:
        return self.test_metrics_from(self.test_outputs(loader))

    def test_metrics_from(self, outputs) -> dict[str, float]:
        """mAP@50-95 / @50, group TPR, |1-DI|, delta-EOP, fairness score, per-group evidence, global UFM."""
        preds, gts, loss, feats = outputs
        u = self.ufm
        out = {k: float(v) for k, v in detection_map(preds, gts).items()}
        out.update(detection_fairness(list(zip(preds, gts)), self.num_groups, iou_threshold=u.iou_threshold,
                                      score_threshold=u.score_threshold))
        out.update(self._ufm(preds, gts, feats).as_dict())
        out["loss"] = loss
        return out

    def group_outcomes(self, loader, num_groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-group (TP, persons) and, as FairFed's accuracy, (persons found, persons) over every person."""
        preds, gts, _ = self.collect(loader)
        pairs = list(zip(preds, gts))
        u = self.ufm
        tp, fn = group_counts(pairs, num_groups, iou_threshold=u.iou_threshold, score_threshold=u.score_threshold)
        found = [match_pred_gt(p, g, u.iou_threshold, u.score_threshold)[1] for p, g in pairs]
        accuracy = torch.tensor([sum(int(f.sum()) for f in found), sum(f.numel() for f in found)])
        return tp, tp + fn, accuracy

    def bn_forward(self, batch: dict) -> None:
        self.model(self.place(batch)["img"])

    def per_sample_losses(self, batch: dict) -> torch.Tensor:
        """Per-image Dirichlet NLL (detection has no single per-image correctness, so every image counts)."""
        return self.criterion.compute(self.model(batch["img"]), batch).per_image_cls
