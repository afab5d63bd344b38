"""Evidential predictions of an exported global model: boxes plus per-box alpha_0 and vacuity.

    from resfl_lightning.models.predict import predict
    dets = predict("runs/<run>/export/global.pt", ["street.jpg"])   # one Detections per image
    dets[0].boxes, dets[0].scores, dets[0].alpha0, dets[0].vacuity

Pre- and post-processing are ultralytics' own (LetterBox with its minimum-rectangle padding, boxes scaled back to
the original image), and `conf` / `iou` / `max_det` default to `YOLO.predict`'s, so the boxes and scores equal
`ultralytics.YOLO(path).predict(...)` on the same inputs; this adds the Dirichlet evidence of each box.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from resfl_lightning.models.yolo import EvidentialYOLO


@dataclass
class Detections:
    """Post-NMS detections of one image, in the original image's pixel coordinates.

    score = E[p_c] = alpha_c / alpha_0 (what ultralytics reports as `conf`); alpha0 = total Dirichlet evidence over the
    C classes + background; vacuity = (C + 1) / alpha0 in (0, 1] (1 = no evidence); u_box = mean NIG epistemic
    variance of the box coordinates (image-normalised).
    """

    boxes: torch.Tensor  # (n, 4) xyxy
    scores: torch.Tensor  # (n,)
    labels: torch.Tensor  # (n,) class index
    alpha0: torch.Tensor  # (n,)
    vacuity: torch.Tensor  # (n,)
    u_box: torch.Tensor  # (n,)
    names: dict[int, str]

    def __len__(self) -> int:
        return int(self.boxes.shape[0])

    def records(self) -> list[dict[str, Any]]:
        """One JSON-ready dict a box: xyxy, score, label, name, alpha0, vacuity, u_box."""
        return [{"xyxy": [float(v) for v in self.boxes[i].tolist()], "score": float(self.scores[i]),
                 "label": int(self.labels[i]), "name": self.names[int(self.labels[i])],
                 "alpha0": float(self.alpha0[i]), "vacuity": float(self.vacuity[i]), "u_box": float(self.u_box[i])}
                for i in range(len(self))]


def _as_bgr(image: Any) -> np.ndarray:
    """A path, PIL image (RGB) or HWC uint8 array (BGR, ultralytics' / cv2's convention) -> HWC uint8 BGR."""
    if isinstance(image, (str, Path)):
        from ultralytics.utils.patches import imread

        arr = imread(str(image))
        if arr is None:
            raise FileNotFoundError(f"cannot read image {image}")
        return arr
    if hasattr(image, "convert"):  # PIL
        return np.asarray(image.convert("RGB"))[:, :, ::-1].copy()
    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"expected an HWC uint8 BGR image, got shape {arr.shape} dtype {arr.dtype}")
    return arr


def preprocess(images: Sequence[Any], imgsz: int, stride: int) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Ultralytics' predict pre-processing: LetterBox (minimum rectangle when all shapes match), BGR->RGB, /255."""
    from ultralytics.data.augment import LetterBox

    originals = [_as_bgr(im) for im in images]
    same_shapes = len({im.shape for im in originals}) == 1
    letterbox = LetterBox((imgsz, imgsz), auto=same_shapes, stride=stride)
    batch = np.stack([letterbox(image=im) for im in originals])
    x = torch.from_numpy(batch).permute(0, 3, 1, 2).flip(1).float().div(255.0)
    return x, [im.shape[:2] for im in originals]


@torch.no_grad()
def predict(model: EvidentialYOLO | str | Path, images: Any, conf: float = 0.25, iou: float = 0.7,
            max_det: int = 300, imgsz: int | None = None) -> list[Detections]:
    """Detections with evidence for each image.

    model: an export (`runs/<run>/export/global.pt`) or an EvidentialYOLO. images: a path, PIL image, HWC uint8 BGR
    array, a list of those, or a (B, 3, H, W) RGB float tensor in [0, 1] with H, W multiples of the largest stride
    (used as is, like ultralytics does with tensors). imgsz: letterbox size (default: the model's training size).
    """
    from ultralytics.utils.ops import scale_boxes

    names = None
    if not isinstance(model, EvidentialYOLO):
        from resfl_lightning.models.export import load_evidential

        model, info = load_evidential(model)
        names = {int(k): v for k, v in info["names"].items()}
    names = names or {i: f"class{i}" for i in range(model.num_classes)}
    model = model.eval()
    device = next(model.parameters()).device
    stride = int(model.strides.max())
    if isinstance(images, torch.Tensor):
        x = images if images.ndim == 4 else images.unsqueeze(0)
        shapes = [tuple(x.shape[2:])] * x.shape[0]
    else:
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        x, shapes = preprocess(images, imgsz or model.spec.image_size, stride)
    x = x.to(device=device, dtype=torch.float32)
    raw = model.predict(model(x), conf=conf, iou=iou, max_det=max_det)
    out = []
    for det, shape in zip(raw, shapes):
        boxes = scale_boxes(tuple(x.shape[2:]), det["boxes"].float().clone(), shape)
        out.append(Detections(boxes=boxes.cpu(), scores=det["scores"].cpu(), labels=det["labels"].cpu(),
                              alpha0=det["alpha0"].cpu(), vacuity=(model.num_outcomes / det["alpha0"]).cpu(),
                              u_box=det["u_box"].cpu(), names=names))
    return out
