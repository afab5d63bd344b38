"""YOLOv8 (ultralytics, built from yaml, random init) with an evidential Dirichlet head and an NIG box branch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import batched_nms
from ultralytics.nn.tasks import DetectionModel, yaml_model_load
from ultralytics.utils.tal import dist2bbox, make_anchors

# Width multipliers below ultralytics' "n" for fast CPU tests and the built-in benchmark.
EXTRA_SCALES = {"pico": [0.33, 0.125, 1024], "femto": [0.33, 0.0625, 1024]}


@dataclass(frozen=True)
class YoloSpec:
    """What to build: yaml family, scale, number of object classes, input size."""

    num_classes: int = 1
    scale: str = "n"
    yaml: str = "yolov8.yaml"
    image_size: int = 640
    reg_max: int = 16


def _load_yaml(spec: YoloSpec, num_outcomes: int) -> dict:
    cfg = yaml_model_load(spec.yaml)
    cfg["scales"] = {**cfg["scales"], **EXTRA_SCALES}
    if spec.scale not in cfg["scales"]:
        raise ValueError(f"model.scale={spec.scale!r} is not one of {sorted(cfg['scales'])}")
    cfg["scale"] = spec.scale
    cfg["nc"] = num_outcomes
    return cfg


class EvidentialYOLO(nn.Module):
    """YOLOv8 whose class branch outputs Dirichlet logits over C classes + background, plus NIG box parameters.

    forward() always returns the raw per-anchor outputs (training and eval alike); predict() decodes them.
    """

    def __init__(self, spec: YoloSpec):
        super().__init__()
        if spec.num_classes < 1:
            raise ValueError(f"model.num_classes must be >= 1, got {spec.num_classes}")
        self.spec = spec
        self.num_classes = spec.num_classes
        self.num_outcomes = spec.num_classes + 1  # background outcome keeps the Dirichlet proper for C = 1
        self.detector = DetectionModel(_load_yaml(spec, self.num_outcomes), nc=self.num_outcomes, verbose=False)
        detect = self.detector.model[-1]
        self.reg_max = detect.reg_max
        self.register_buffer("strides", detect.stride.clone().float(), persistent=False)
        feat_channels = [detect.cv2[i][0].conv.in_channels for i in range(detect.nl)]
        self.feature_channels = feat_channels
        # NIG branch: (nu, alpha, beta) for each of x, y, w, h.
        self.nig = nn.ModuleList(nn.Conv2d(c, 12, 1) for c in feat_channels)
        for conv in self.nig:
            nn.init.zeros_(conv.weight)
            nn.init.constant_(conv.bias, 0.5)
        self.register_buffer("proj", torch.arange(self.reg_max, dtype=torch.float32), persistent=False)
        self._init_evidence_bias(detect)

    def _init_evidence_bias(self, detect: nn.Module, object_logit: float = -2.0, background_logit: float = 4.0) -> None:
        """Start with weak object evidence and moderate background evidence (p_object ~ 0.18).

        Softplus evidence grows linearly, unlike a sigmoid's logit, so ultralytics' bias prior (p ~ 1e-3) would
        need background evidence in the thousands and starve the object logits of gradient.
        """
        for seq in detect.cv3:
            bias = seq[-1].bias.data
            bias[: self.num_classes] = object_logit
            bias[self.num_classes:] = background_logit

    @property
    def head_parameters(self) -> list[nn.Parameter]:
        """The detection head (box, class, NIG branches): default parameter subset for the Fisher term."""
        detect = self.detector.model[-1]
        return [*detect.cv2.parameters(), *detect.cv3.parameters(), *self.nig.parameters()]

    def neck(self, img: torch.Tensor) -> list[torch.Tensor]:
        """Backbone + neck: the multi-level feature maps that feed the Detect head."""
        y: list[torch.Tensor | None] = []
        x = img
        layers = self.detector.model
        for m in layers[:-1]:
            if m.f != -1:
                x = y[m.f] if isinstance(m.f, int) else [x if j == -1 else y[j] for j in m.f]
            x = m(x)
            y.append(x if m.i in self.detector.save else None)
        return [y[j] for j in layers[-1].f]

    def forward(self, img: torch.Tensor) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        feats = self.neck(img)
        detect = self.detector.model[-1]
        out = detect.forward_head(feats, **detect.one2many)
        bs = img.shape[0]
        out["nig"] = torch.cat([self.nig[i](feats[i]).view(bs, 12, -1) for i in range(len(feats))], dim=-1)
        return out

    def decode(self, out: dict) -> dict[str, torch.Tensor]:
        """Per-anchor decoded tensors: boxes xyxy pixels (B,A,4), alpha (B,A,K), NIG (B,A,4,3), anchors, strides."""
        anchors, strides = make_anchors(out["feats"], self.strides, 0.5)
        b, _, a = out["boxes"].shape
        dist = out["boxes"].permute(0, 2, 1).reshape(b, a, 4, self.reg_max).softmax(3).matmul(self.proj)
        boxes = dist2bbox(dist, anchors, xywh=False) * strides
        alpha = 1.0 + F.softplus(out["scores"].permute(0, 2, 1).float())
        nig = out["nig"].permute(0, 2, 1).reshape(b, a, 4, 3)
        return {"boxes": boxes, "alpha": alpha, "nig_raw": nig, "anchors": anchors, "strides": strides,
                "dist": out["boxes"].permute(0, 2, 1)}

    @torch.no_grad()
    def predict(self, out: dict, conf: float = 0.25, iou: float = 0.5, max_det: int = 300) -> list[dict]:
        """Post-NMS detections per image; score = expected Dirichlet probability of the best object class."""
        from resfl_lightning.losses.evidential import nig_epistemic_variance, nig_params

        dec = self.decode(out)
        alpha = dec["alpha"]
        alpha0 = alpha.sum(-1)
        probs = alpha[..., : self.num_classes] / alpha0.unsqueeze(-1)
        scores, labels = probs.max(-1)
        nu, a_nig, beta = nig_params(dec["nig_raw"])
        stride0 = float(self.strides[0])
        height, width = out["feats"][0].shape[2] * stride0, out["feats"][0].shape[3] * stride0
        limits = torch.tensor([width, height, width, height], device=alpha.device)
        u_box = (nig_epistemic_variance(nu, a_nig, beta)).mean(-1)  # coordinates are image-normalised
        results = []
        for i in range(alpha.shape[0]):
            keep = scores[i] > conf
            boxes, sc, lb = dec["boxes"][i][keep], scores[i][keep], labels[i][keep]
            a0, ub = alpha0[i][keep], u_box[i][keep]
            idx = batched_nms(boxes, sc, lb, iou)[:max_det]
            results.append({
                "boxes": torch.minimum(boxes[idx].clamp(min=0), limits), "scores": sc[idx], "labels": lb[idx],
                "alpha0": a0[idx], "u_cls": 1.0 / (a0[idx] + 1.0), "u_box": ub[idx],
            })
        return results
