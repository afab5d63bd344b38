"""Which cohorts UFM is computed over (docs/method.md §3): true groups, partial/noisy groups, or label-free cohorts."""

from __future__ import annotations

import torch

from resfl_lightning.clients.base import UfmSettings
from resfl_lightning.metrics.matching import match_pred_gt
from resfl_lightning.metrics.ufm import (
    cohorts_kmeans,
    cohorts_proxy,
    cohorts_vacuity_slices,
    drop_group_labels,
    flip_group_labels,
)

COHORT_MODES = ("groups", "cluster", "slices", "proxy")


def effective_mode(ufm: UfmSettings) -> str:
    """p = 1 (every group label dropped) falls back to AF-UFM-Cluster."""
    if ufm.cohorts not in COHORT_MODES:
        raise ValueError(f"ufm.cohorts={ufm.cohorts!r} is not one of {', '.join(COHORT_MODES)}")
    return "cluster" if ufm.cohorts == "groups" and ufm.drop_fraction >= 1.0 else ufm.cohorts


def person_vacuity(preds: list[dict], gts: list[dict], ufm: UfmSettings) -> torch.Tensor:
    """1/alpha0 of the detection matched to each ground-truth person (inf when missed), flattened over images."""
    out = []
    for pred, gt in zip(preds, gts):
        pred_to_gt, _ = match_pred_gt(pred, gt, ufm.iou_threshold, ufm.score_threshold)
        vac = torch.full((gt["boxes"].shape[0],), float("inf"), dtype=torch.float64)
        hit = pred_to_gt >= 0
        vac[pred_to_gt[hit]] = 1.0 / pred["alpha0"][hit].double()
        out.append(vac)
    return torch.cat(out) if out else torch.empty(0, dtype=torch.float64)


def ufm_cohorts(preds: list[dict], gts: list[dict], ufm: UfmSettings, num_groups: int, seed: int,
                features: list[torch.Tensor] | None = None) -> list[torch.Tensor] | None:
    """Per-image cohort ids replacing gt['groups'] in UFM, or None to use the true groups unchanged."""
    mode = effective_mode(ufm)
    counts = [int(g["boxes"].shape[0]) for g in gts]
    if mode == "groups":
        if ufm.drop_fraction == 0 and ufm.flip_rate == 0:
            return None
        flat = torch.cat([g["groups"].long() for g in gts])
        if ufm.flip_rate > 0:
            flat = flip_group_labels(flat, ufm.flip_rate, num_groups, seed)
        if ufm.drop_fraction > 0:
            flat = drop_group_labels(flat, ufm.drop_fraction, seed + 1)
    elif mode == "cluster":
        if features is None:
            raise ValueError("ufm.cohorts=cluster needs per-person features")
        x = torch.cat(features)
        flat = cohorts_kmeans(x, min(ufm.num_cohorts, x.shape[0]), seed) if x.shape[0] else torch.empty(0).long()
    elif mode == "slices":
        vac = person_vacuity(preds, gts, ufm)
        flat = cohorts_vacuity_slices(vac, min(ufm.num_cohorts, vac.numel())) if vac.numel() else vac.long()
    else:
        proxy = torch.cat([g["proxy"].long() for g in gts]).tolist()
        flat = cohorts_proxy([None if v < 0 else v for v in proxy])
    return list(torch.split(flat, counts))
