"""PUFFLE's fairness regulariser (Corbucci et al. 2024; docs/method.md §5a): the one-vs-rest demographic-parity gap
of the model's predictions, after Yaghini et al. 2023.

P~(k|z) = (1/|Z=z|) sum_{i: z_i = z, argmax p_i = k} p_ik and L_fair = max over (k, z) of |P~(k|z) - P~(k|not z)|.
The mass p_ik counts only where k is the predicted class, so the gap is a differentiable stand-in for the gap of the
hard predictions' rates.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchvision.ops import box_iou


def parity_gap(mass: torch.Tensor, groups: torch.Tensor, global_rates: torch.Tensor | None = None) -> torch.Tensor:
    """max over (k, z) of |mean_{z_i = z} mass_ik - mean_{z_i != z} mass_ik| for mass (N, K).

    Rows of group -1 (unknown) take no part. A group that is the whole batch (no "not z" rows) contributes nothing
    itself. A group absent from the batch contributes max_k |P(k|z) - mean_{known i} mass_ik| when global_rates
    (G, K), the server's P(k|z) (clients/parity_rates.py; a constant, NaN rows: no estimate), has its row; without
    one it contributes nothing (the paper's term before the server's estimate exists). With no comparable group the
    result is a graph-connected 0."""
    groups = groups.reshape(-1).long()
    if mass.dim() != 2 or mass.shape[0] != groups.shape[0]:
        raise ValueError(f"parity_gap: mass {tuple(mass.shape)} and groups {tuple(groups.shape)} must share the "
                         "first dimension")
    known = groups >= 0
    gaps = []
    for z in torch.unique(groups[known]).tolist():
        inside, rest = groups == z, known & (groups != z)
        if not bool(rest.any()):
            continue
        gaps.append((mass[inside].mean(dim=0) - mass[rest].mean(dim=0)).abs().max())
    if global_rates is not None and bool(known.any()):
        gaps += _missing_group_gaps(mass[known], groups[known], global_rates)
    if not gaps:
        return mass.sum() * 0.0
    return torch.stack(gaps).max()


def _missing_group_gaps(mass: torch.Tensor, groups: torch.Tensor, global_rates: torch.Tensor) -> list[torch.Tensor]:
    """The gap of each group with a global estimate that the batch lacks: every known row is "not z"."""
    rates = global_rates.detach().to(device=mass.device, dtype=mass.dtype)
    present = torch.zeros(rates.shape[0], dtype=torch.bool, device=mass.device)
    present[groups[groups < rates.shape[0]]] = True
    missing = (~present & ~rates.isnan().any(dim=1)).nonzero().flatten().tolist()
    if not missing:
        return []
    rest = mass.mean(dim=0)
    return [(rates[z] - rest).abs().max() for z in missing]


def prediction_mass(logits: torch.Tensor) -> torch.Tensor:
    """Classification: p = softmax(logits); the mass of row i is p_ik at its predicted class k, 0 elsewhere."""
    p = logits.softmax(dim=-1)
    predicted = F.one_hot(p.argmax(dim=-1), p.shape[-1]).to(p.dtype)
    return p * predicted


def prediction_parity_gap(logits: torch.Tensor, groups: torch.Tensor,
                          global_rates: torch.Tensor | None = None) -> torch.Tensor:
    """Classification: the gap of `prediction_mass`."""
    return parity_gap(prediction_mass(logits), groups, global_rates)


def person_scores(boxes: torch.Tensor, probs: torch.Tensor, gt_boxes: torch.Tensor, gt_image: torch.Tensor,
                  gt_class: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Detection (paper silent - our reading): one score per ground-truth person, the highest probability of its
    class among the predictions of its image whose box overlaps it with IoU >= iou_threshold, 0 if none.

    boxes (B, A, 4) xyxy pixels, probs (B, A, C) per-anchor class probabilities, gt_boxes (P, 4) xyxy pixels,
    gt_image (P,) image index, gt_class (P,) class index. Gradients reach the scores, not the boxes (the overlap
    only selects)."""
    if gt_boxes.shape[0] == 0:
        return probs.sum() * 0.0 + probs.new_zeros(0)
    gt_image, gt_class = gt_image.long(), gt_class.long()
    with torch.no_grad():
        iou = torch.stack([box_iou(gt_boxes[i:i + 1], boxes[gt_image[i]])[0] for i in range(gt_boxes.shape[0])])
    own = probs[gt_image, :, gt_class]  # (P, A): each person's class probability at every anchor of its image
    matched = torch.where(iou >= iou_threshold, own, torch.zeros_like(own))
    return matched.max(dim=1).values


def detection_parity_gap(scores: torch.Tensor, groups: torch.Tensor, score_threshold: float,
                         global_rates: torch.Tensor | None = None) -> torch.Tensor:
    """Detection: max over groups g of |P~(det|g) - P~(det|not g)| with the mass p [p >= score_threshold] of each
    person (an equal-opportunity gap, since every unit is a positive)."""
    return parity_gap(detection_mass(scores, score_threshold), groups, global_rates)


def detection_mass(scores: torch.Tensor, score_threshold: float) -> torch.Tensor:
    """Detection: the (P, 1) mass p [p >= score_threshold] of each person."""
    return torch.where(scores >= score_threshold, scores, torch.zeros_like(scores)).unsqueeze(1)
