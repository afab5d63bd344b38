"""RESFL detection client: evidential YOLOv8 + GRL adversary on ROI-pooled neck features (SPEC §1-3)."""

from __future__ import annotations

import torch

from resfl_lightning.clients.base import EvalResult, FederatedClient, LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.cohorts import effective_mode, ufm_cohorts
from resfl_lightning.data.detection import ground_truth_for
from resfl_lightning.losses.adversary import Adversary, adversarial_loss, roi_pool_features
from resfl_lightning.losses.detection import EvidentialDetectionLoss
from resfl_lightning.metrics.detection import detection_map
from resfl_lightning.metrics.fairness import detection_fairness
from resfl_lightning.metrics.ufm import ufm_from_detections
from resfl_lightning.models.yolo import EvidentialYOLO, YoloSpec


def gt_boxes_xyxy(batch: dict, image_hw: tuple[int, int]) -> torch.Tensor:
    """Normalised xywh ground truth -> pixel xyxy."""
    h, w = image_hw
    xywh = batch["bboxes"] * batch["bboxes"].new_tensor([w, h, w, h])
    return torch.cat([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], dim=1)


class DetectionClient(FederatedClient):
    def __init__(self, spec: YoloSpec, num_groups: int, weights: LossWeights, ufm: UfmSettings,
                 optim: OptimSettings, adversary_hidden: int = 128, map_conf: float = 0.001, max_det: int = 300):
        super().__init__(weights, ufm, optim)
        self.spec, self.num_groups = spec, num_groups
        self.model = EvidentialYOLO(spec)
        self.adversary = Adversary(sum(self.model.feature_channels), num_groups, hidden=adversary_hidden,
                                   grl_scale=weights.grl_scale)
        self.criterion = EvidentialDetectionLoss(self.model)
        self.map_conf, self.max_det = map_conf, max_det

    def curvature_parameters(self) -> list[torch.nn.Parameter]:
        return self.model.head_parameters if self.weights.curv_params == "head" else list(self.model.parameters())

    def person_features(self, feats: list[torch.Tensor], batch: dict) -> torch.Tensor:
        """h: neck features ROI-aligned at each ground-truth person box and average-pooled (one row per person)."""
        image_hw = tuple(batch["img"].shape[2:])
        boxes = gt_boxes_xyxy(batch, image_hw)
        strides = [int(s) for s in self.model.strides.tolist()]
        return roi_pool_features(feats, strides, boxes, batch["batch_idx"].long())

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.model(batch["img"])
        res = self.criterion.compute(out, batch)
        w = self.weights
        if w.lambda_priv > 0 and batch["groups"].numel():
            adv = adversarial_loss(self.adversary, self.person_features(out["feats"], batch), batch["groups"])
        else:
            adv = res.task * 0.0
        unc_values = self.kl_coefficient() * res.fg_unc + res.fg_nig_reg
        return self.compose_loss(res.task, adv, unc_values, res.fg_groups, res.per_image_cls, res.parts)

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
        u = self.ufm
        cohorts = ufm_cohorts(preds, gts, u, self.num_groups, seed=self.client_id + 1000 * self.round_idx,
                              features=features)
        return ufm_from_detections(list(zip(preds, gts)), cohorts=cohorts, score_threshold=u.score_threshold,
                                   iou_threshold=u.iou_threshold, evidence_floor=u.evidence_floor, eps=u.eps)

    def evaluate(self, loader) -> EvalResult:
        preds, gts, loss, feats = self._collect_for_ufm(loader)
        ap = detection_map(preds, gts)
        return EvalResult(ufm_raw=float(self._ufm(preds, gts, feats).ufm), utility=float(ap["map"]),
                          utility50=float(ap["map_50"]), eval_loss=loss)

    def test_metrics(self, loader) -> dict[str, float]:
        """mAP@50-95 / @50, group TPR, |1-DI|, delta-EOP, fairness score, per-group evidence, global UFM."""
        preds, gts, loss, feats = self._collect_for_ufm(loader)
        u = self.ufm
        out = {k: float(v) for k, v in detection_map(preds, gts).items()}
        out.update(detection_fairness(list(zip(preds, gts)), self.num_groups, iou_threshold=u.iou_threshold,
                                      score_threshold=u.score_threshold))
        out.update(self._ufm(preds, gts, feats).as_dict())
        out["loss"] = loss
        return out

    def per_sample_losses(self, batch: dict) -> torch.Tensor:
        """Per-image Dirichlet NLL (detection has no single per-image correctness, so every image counts)."""
        return self.criterion.compute(self.model(batch["img"]), batch).per_image_cls
