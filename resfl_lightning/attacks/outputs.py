"""Per-sample outputs of a client model turned into attack inputs: MIA features, ROI features, head prefixes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torchvision.ops import batched_nms

from resfl_lightning.attacks.mia import classification_mia_features, detection_mia_features


# --- per-sample outputs of a detection client ---------------------------------------------------------------------
@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)


def _to_device(fabric: Any, batch: dict) -> dict:
    return fabric.to_device(batch) if fabric is not None else batch


def _image_slice(out: dict, batch: dict, i: int) -> tuple[dict, dict]:
    """Raw model outputs and the ground truth of image i alone (a batch of one)."""
    out_i = {k: ([f[i:i + 1] for f in v] if isinstance(v, list) else v[i:i + 1]) for k, v in out.items()}
    sel = batch["batch_idx"].long() == i
    batch_i = {"img": batch["img"][i:i + 1], "batch_idx": torch.zeros_like(batch["batch_idx"][sel]),
               "cls": batch["cls"][sel], "bboxes": batch["bboxes"][sel], "groups": batch["groups"][sel]}
    return out_i, batch_i


def _kept_anchors(model: Any, out: dict, conf: float, iou: float, max_det: int) -> list[torch.Tensor]:
    """Per image, the anchor indices that EvidentialYOLO.predict keeps (same threshold, NMS and cap)."""
    dec = model.decode(out)
    alpha = dec["alpha"]
    probs = alpha[..., : model.num_classes] / alpha.sum(-1, keepdim=True)
    scores, labels = probs.max(-1)
    kept = []
    for i in range(alpha.shape[0]):
        cand = torch.nonzero(scores[i] > conf).flatten()
        idx = batched_nms(dec["boxes"][i][cand], scores[i][cand], labels[i][cand], iou)[:max_det]
        kept.append(cand[idx])
    return kept


def logit_margins(model: Any, out: dict, kept: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per image: mean over its post-NMS detections of log alpha_label - log alpha_background (the Dirichlet
    log-evidence margin of the detected class over background); an image without detections uses its single
    highest-scoring anchor, so the feature is defined for every image."""
    alpha = model.decode(out)["alpha"]  # (B, A, C + 1), background last
    c = model.num_classes
    log_a = alpha.log()
    best_cls = log_a[..., :c].max(-1)  # the predicted class per anchor (= predict's label)
    margin = best_cls.values - log_a[..., c]  # (B, A)
    out_m = []
    for i, idx in enumerate(kept):
        if idx.numel():
            out_m.append(margin[i, idx].mean())
        else:
            out_m.append(margin[i, torch.argmax((alpha[i, :, :c] / alpha[i].sum(-1, keepdim=True)).max(-1).values)])
    return torch.stack(out_m) if out_m else torch.zeros(0)


@torch.no_grad()
def detection_outputs(client: Any, loader: Any, fabric: Any = None, score_threshold: float = 0.25) -> dict[str, Any]:
    """Eval-mode per-image outputs for the MIA: post-NMS predictions at tau, full task loss, logit margin, image ids.

    loss = the client's full detection task loss (CIoU box + Dirichlet NLL + DFL + NIG NLL, with its gains) of the
    image on its own ground truth; margin: see logit_margins().
    """
    model, iou, max_det = client.model, client.ufm.iou_threshold, client.max_det
    preds, losses, margins, ids = [], [], [], []
    with eval_mode(client):
        for batch in loader:
            batch = _to_device(fabric, batch)
            out = model(batch["img"])
            p = model.predict(out, conf=score_threshold, iou=iou, max_det=max_det)
            kept = _kept_anchors(model, out, score_threshold, iou, max_det)
            for i, (pi, ki) in enumerate(zip(p, kept)):
                if ki.numel() != pi["scores"].numel():
                    raise RuntimeError(f"image {int(batch['image_id'][i])}: NMS replay kept {ki.numel()} anchors, "
                                       f"predict() kept {pi['scores'].numel()}")
                out_i, batch_i = _image_slice(out, batch, i)
                losses.append(float(client.criterion.compute(out_i, batch_i).task))
            margins.append(logit_margins(model, out, kept).float().cpu())
            preds += [{k: v.detach().cpu() for k, v in d.items()} for d in p]
            ids.append(batch["image_id"].cpu())
    return {"preds": preds, "losses": np.asarray(losses, np.float64),
            "margins": torch.cat(margins).numpy().astype(np.float64) if margins else np.zeros(0),
            "image_ids": torch.cat(ids).numpy() if ids else np.zeros(0, np.int64)}


@contextlib.contextmanager
def attached_fabric(client: Any, fabric: Any) -> Iterator[None]:
    """Let a client's own collect() move batches to the device, without leaving it logging through Fabric."""
    previous = client._fabric
    client._fabric = fabric
    try:
        yield
    finally:
        client._fabric = previous


def classification_outputs(client: Any, loader: Any, fabric: Any = None) -> Any:
    """The classification client's eval-mode collect() (alpha, penultimate features, per-sample NLL, y, groups)."""
    if not hasattr(client, "collect"):
        raise NotImplementedError(f"{type(client).__name__} (task 'classification') needs collect(loader)")
    with attached_fabric(client, fabric if fabric is not None else client._fabric):
        return client.collect(loader)


def is_detection_client(client: Any) -> bool:
    return hasattr(client, "criterion") and hasattr(client, "person_features")


def mia_features(client: Any, loader: Any, fabric: Any = None, score_threshold: float = 0.25) -> np.ndarray:
    """Per-sample MIA feature matrix of a client on a loader (detection: 7 columns, classification: 6).

    Classification: [max prob, entropy, alpha0, u_cls, per-sample Dirichlet NLL, top-1 minus top-2 probability].
    """
    if is_detection_client(client):
        o = detection_outputs(client, loader, fabric, score_threshold)
        return detection_mia_features(o["preds"], o["losses"], o["margins"])
    pred = classification_outputs(client, loader, fabric)
    return classification_mia_features(pred.probs, pred.alpha0, pred.losses)


def example_confidences(client: Any, loader: Any, fabric: Any = None, score_threshold: float = 0.25) -> np.ndarray:
    """Per-sample exp(-loss) for the reference-model MIAs: detection, the image's full task loss (detection_outputs);
    classification, the row's NLL, so this is the probability of the true label."""
    if is_detection_client(client):
        losses = detection_outputs(client, loader, fabric, score_threshold)["losses"]
    else:
        losses = classification_outputs(client, loader, fabric).losses.double().numpy()
    return np.exp(-np.asarray(losses, np.float64))


@torch.no_grad()
def representation_features(client: Any, loader: Any, fabric: Any = None, boxes: str = "matched",
                            score_threshold: float = 0.25, min_matched: int = 20) -> dict[str, Any]:
    """Neck features ROI-aligned and average-pooled per person, with the person's group (known groups only).

    boxes="matched": at the detections matched to ground-truth persons by the fairness matching protocol
    (docs/method.md §6), labelled with the matched person's group; when fewer than `min_matched` persons are matched
    (a weak model), or boxes="ground_truth", at every ground-truth person box instead. Classification clients give
    their penultimate features per sample. Returns features (n, d), groups (n,), n_matched, and source ("matched",
    "ground_truth" or "penultimate").
    """
    if not is_detection_client(client):  # classification: the penultimate features the GRL adversary sees
        pred = classification_outputs(client, loader, fabric)
        known = pred.groups >= 0
        return {"features": pred.features[known].numpy(), "groups": pred.groups[known].numpy(), "n_matched": 0,
                "source": "penultimate"}
    from resfl_lightning.data.detection import ground_truth_for
    from resfl_lightning.losses.adversary import roi_pool_features
    from resfl_lightning.metrics.matching import match_pred_gt

    model = client.model
    strides = [int(s) for s in model.strides.tolist()]
    matched_f, matched_g, gt_f, gt_g = [], [], [], []
    with eval_mode(client):
        for batch in loader:
            batch = _to_device(fabric, batch)
            out = model(batch["img"])
            gt_f.append(client.person_features(out["feats"], batch).float().cpu())
            gt_g.append(batch["groups"].long().cpu())
            if boxes != "matched":
                continue
            iou = client.ufm.iou_threshold
            preds = model.predict(out, conf=score_threshold, iou=iou, max_det=client.max_det)
            rois, owner, groups = [], [], []
            for i, (pred, gt) in enumerate(zip(preds, ground_truth_for(batch))):
                pred = {k: v.cpu() for k, v in pred.items()}
                gt = {k: v.cpu() for k, v in gt.items()}
                pred_to_gt, _ = match_pred_gt(pred, gt, iou, score_threshold)
                hit = torch.nonzero(pred_to_gt >= 0).flatten()
                g = gt["groups"][pred_to_gt[hit]]
                known = g >= 0
                rois.append(pred["boxes"][hit[known]])
                groups.append(g[known])
                owner.append(torch.full((int(known.sum()),), i, dtype=torch.long))
            if sum(len(r) for r in rois):
                matched_f.append(roi_pool_features(out["feats"], strides, torch.cat(rois), torch.cat(owner))
                                 .float().cpu())
                matched_g.append(torch.cat(groups).long())
    n_matched = int(sum(len(g) for g in matched_g))
    if boxes == "matched" and n_matched >= min_matched:
        feats, groups, source = torch.cat(matched_f), torch.cat(matched_g), "matched"
    else:
        feats, groups, source = torch.cat(gt_f), torch.cat(gt_g), "ground_truth"
    known = groups >= 0
    return {"features": feats[known].numpy(), "groups": groups[known].numpy(), "n_matched": n_matched,
            "source": source}


# --- update-aware AIA ---------------------------------------------------------------------------------------------
def default_head_prefixes(client: Any) -> list[str]:
    """State-dict prefixes of the detection head (Detect module + NIG branch), else of the model's last layer (the
    adversary, registered after the model, is not the head)."""
    model = getattr(client, "model", None)
    if model is not None and hasattr(model, "detector") and hasattr(model, "nig"):
        return [f"model.detector.model.{len(model.detector.model) - 1}.", "model.nig."]
    module, prefix = (model, "model.") if model is not None else (client, "")
    names = [prefix + n for n, _ in module.named_parameters()]
    if not names:
        raise ValueError(f"{type(client).__name__} has no parameters")
    return [names[-1].rsplit(".", 1)[0] + "."]
