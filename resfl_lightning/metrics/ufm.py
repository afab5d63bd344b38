"""Uncertainty Fairness Metric (docs/method.md §3) and the label-free / partial-label cohort builders.

UFM compares the mean Dirichlet strength alpha_0 (evidence) the model shows on each group:
Delta_u = max_g 1/abar_g - min_g 1/abar_g, UFM = Delta_u / (mean_g 1/abar_g + eps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from resfl_lightning.metrics.matching import match_pred_gt

__all__ = [
    "ReportedUFM",
    "UFMResult",
    "cohorts_kmeans",
    "cohorts_proxy",
    "cohorts_vacuity_slices",
    "drop_group_labels",
    "drop_small_cohorts",
    "flip_group_labels",
    "image_group_evidence",
    "insufficient_ufm",
    "relative_gate_threshold",
    "reported_ufm",
    "ufm_from_detections",
    "ufm_from_group_evidence",
    "ufm_bootstrap_se",
    "ufm_from_samples",
    "ufm_from_units",
]

Pair = tuple[Mapping[str, Tensor], Mapping[str, Tensor]]


@dataclass(frozen=True)
class UFMResult:
    """Raw UFM, its numerator Delta_u, and the floored mean evidence abar_g of every group present in the split."""

    ufm: float
    delta_u: float
    mean_evidence: dict[int, float]
    floored: tuple[int, ...]  # groups whose abar fell below evidence_floor (e.g. never detected)

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat dict for loggers: ufm, delta_u, mean_evidence/<g>."""
        out = {f"{prefix}ufm": self.ufm, f"{prefix}delta_u": self.delta_u}
        out.update({f"{prefix}mean_evidence/{g}": v for g, v in self.mean_evidence.items()})
        return out


def relative_gate_threshold(utilities: Sequence[float], k: float = 3.0) -> float | None:
    """median - k * MAD of the clients' validation utilities (raw MAD, not scaled to a normal sd); None if empty."""
    x = np.asarray([u for u in utilities if u is not None and math.isfinite(u)], dtype=float)
    if x.size == 0:
        return None
    med = float(np.median(x))
    return med - k * float(np.median(np.abs(x - med)))


def insufficient_ufm() -> UFMResult:
    """The result for a split with fewer than two usable groups: UFM is undefined (NaN), not 0."""
    return UFMResult(ufm=math.nan, delta_u=math.nan, mean_evidence={}, floored=())


def drop_small_cohorts(cohorts: Any, min_count: int) -> tuple[Tensor, int]:
    """Set cohorts with fewer than `min_count` members to -1 (unknown); returns (ids, number of cohorts kept)."""
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    ids = torch.as_tensor(cohorts).long().reshape(-1).clone()
    known = ids[ids >= 0]
    values, counts = torch.unique(known, return_counts=True)
    small = values[counts < min_count]
    ids[torch.isin(ids, small)] = -1
    return ids, int((counts >= min_count).sum())


def ufm_from_group_evidence(
    mean_evidence: Mapping[int, float], evidence_floor: float = 1e-3, eps: float = 1e-6
) -> UFMResult:
    """The UFM formula on per-group mean evidence abar_g (floored at evidence_floor so 1/abar stays finite)."""
    if not evidence_floor > 0:
        raise ValueError(f"evidence_floor must be > 0, got {evidence_floor}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not mean_evidence:
        raise ValueError("UFM needs at least one group present in the split; got none")
    for g, v in mean_evidence.items():
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"mean evidence of group {g} must be finite and >= 0, got {v}")
    floored = tuple(sorted(g for g, v in mean_evidence.items() if v < evidence_floor))
    abar = {int(g): max(float(v), evidence_floor) for g, v in sorted(mean_evidence.items())}
    inv = np.array([1.0 / v for v in abar.values()])
    delta_u = float(inv.max() - inv.min())
    return UFMResult(ufm=delta_u / (float(inv.mean()) + eps), delta_u=delta_u, mean_evidence=abar, floored=floored)


def ufm_from_detections(
    pairs: Sequence[Pair],
    cohorts: Sequence[Tensor] | None = None,
    score_threshold: float = 0.25,
    iou_threshold: float = 0.5,
    evidence_floor: float = 1e-3,
    eps: float = 1e-6,
) -> UFMResult:
    """UFM of one client's validation split from per-image (pred, gt) dicts; pred needs 'alpha0'.

    Groups come from gt['groups'] (-1 = unknown, ignored) unless `cohorts` gives one id tensor per image
    (label-free variants). Per image x and group g: mean alpha0 of the detections matched to group-g persons,
    0 if none; abar_g averages that over the images containing a group-g person.
    """
    units = image_group_evidence(pairs, cohorts, score_threshold, iou_threshold)
    if not any(units):
        raise ValueError(f"no ground-truth person with a known group in the {len(pairs)} images; UFM undefined")
    return ufm_from_units(units, evidence_floor, eps)


def ufm_from_units(units: Sequence[Mapping[int, float]], evidence_floor: float = 1e-3,
                   eps: float = 1e-6) -> UFMResult:
    """UFM from per-unit (image or sample) group evidence: abar_g = mean over the units that hold group g."""
    per_group: dict[int, list[float]] = {}
    for unit in units:
        for g, v in unit.items():
            per_group.setdefault(g, []).append(v)
    return ufm_from_group_evidence({g: float(np.mean(v)) for g, v in per_group.items()}, evidence_floor, eps)


def ufm_bootstrap_se(units: Sequence[Mapping[int, float]], resamples: int = 200, seed: int = 0,
                     evidence_floor: float = 1e-3, eps: float = 1e-6) -> float:
    """Bootstrap standard error of the UFM over the split's units (images or samples), resampled with replacement.

    Resamples that keep fewer than two groups are skipped; NaN when fewer than two resamples remain. All resamples
    are evaluated at once on a units x groups matrix (a Python loop over ufm_from_units cost ~0.2 s a client on
    Adult); the draws are the same as one rng.integers call per resample."""
    units = [u for u in units if u]
    if len(units) < 2:
        return math.nan
    if not evidence_floor > 0:
        raise ValueError(f"evidence_floor must be > 0, got {evidence_floor}")
    groups = sorted({int(g) for u in units for g in u})
    column = {g: j for j, g in enumerate(groups)}
    value = np.zeros((len(units), len(groups)))
    held = np.zeros((len(units), len(groups)))
    for i, u in enumerate(units):
        for g, v in u.items():
            if not math.isfinite(v):
                raise ValueError(f"unit {i}: evidence of group {g} must be finite, got {v}")
            value[i, column[int(g)]], held[i, column[int(g)]] = float(v), 1.0
    rng = np.random.default_rng(seed)
    picks = np.stack([rng.integers(0, len(units), len(units)) for _ in range(resamples)])  # (R, U)
    counts = np.stack([np.bincount(row, minlength=len(units)) for row in picks]).astype(float)  # (R, U)
    n_held = counts @ held  # (R, G): units of each group in each resample
    present = n_held > 0
    keep = present.sum(axis=1) >= 2  # as the loop, a resample with one group is skipped
    if keep.sum() < 2:
        return math.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (counts[keep] @ value) / n_held[keep]
    present = present[keep]
    if (means[present] < 0).any():  # as ufm_from_group_evidence refuses a negative group mean
        raise ValueError(f"a resample's mean evidence is negative ({means[present].min()}); evidence must be >= 0")
    inv = np.where(present, 1.0 / np.maximum(np.where(present, means, 1.0), evidence_floor), np.nan)
    spread = np.nanmax(inv, axis=1) - np.nanmin(inv, axis=1)
    return float(np.std(spread / (np.nanmean(inv, axis=1) + eps), ddof=1))


def image_group_evidence(pairs: Sequence[Pair], cohorts: Sequence[Tensor] | None = None,
                         score_threshold: float = 0.25, iou_threshold: float = 0.5) -> list[dict[int, float]]:
    """Per image: {group: mean alpha0 of the detections matched to that group's persons (0 if none)}."""
    if cohorts is not None and len(cohorts) != len(pairs):
        raise ValueError(f"cohorts has {len(cohorts)} entries but there are {len(pairs)} images")
    units: list[dict[int, float]] = []
    for idx, (pred, gt) in enumerate(pairs):
        if "alpha0" not in pred:
            raise KeyError(f"image {idx}: prediction dict lacks key 'alpha0' (has {sorted(pred)})")
        if cohorts is not None:
            groups = torch.as_tensor(cohorts[idx]).long().cpu()
        elif "groups" in gt:
            groups = gt["groups"].long().cpu()
        else:
            raise KeyError(f"image {idx}: ground-truth dict lacks key 'groups' (has {sorted(gt)})")
        if groups.ndim != 1 or groups.shape[0] != gt["boxes"].shape[0]:
            raise ValueError(f"image {idx}: groups shape {tuple(groups.shape)} != ({gt['boxes'].shape[0]},)")
        try:
            pred_to_gt, _ = match_pred_gt(pred, gt, iou_threshold, score_threshold)
        except (KeyError, ValueError) as err:
            raise type(err)(f"image {idx}: {err}") from err
        alpha0 = pred["alpha0"].detach().double().cpu()
        if alpha0.shape != pred_to_gt.shape:
            raise ValueError(f"image {idx}: pred['alpha0'] shape {tuple(alpha0.shape)} != ({pred_to_gt.numel()},)")
        matched = pred_to_gt >= 0
        det_group = torch.full_like(pred_to_gt, -1)
        det_group[matched] = groups[pred_to_gt[matched]]
        unit = {}
        for g in torch.unique(groups[groups >= 0]).tolist():
            sel = det_group == g
            unit[g] = float(alpha0[sel].mean()) if sel.any() else 0.0
        units.append(unit)
    return units


def ufm_from_samples(alpha0: Any, groups: Any, evidence_floor: float = 1e-3, eps: float = 1e-6) -> UFMResult:
    """Per-sample (classification) UFM: abar_g = mean alpha0 of group-g samples; group -1 ignored."""
    a = torch.as_tensor(alpha0).detach().double().cpu().reshape(-1)
    s = torch.as_tensor(groups).detach().long().cpu().reshape(-1)
    if a.shape != s.shape:
        raise ValueError(f"alpha0 and groups lengths differ: {a.numel()} vs {s.numel()}")
    if not torch.isfinite(a).all() or (a < 0).any():
        raise ValueError("alpha0 must be finite and >= 0")
    present = torch.unique(s[s >= 0]).tolist()
    return ufm_from_group_evidence({g: float(a[s == g].mean()) for g in present}, evidence_floor, eps)


class ReportedUFM(NamedTuple):
    """The value u_i a client reports, and the EMA state to carry to the next round (None without EMA)."""

    u: float
    ema: float | None


def reported_ufm(
    raw: float,
    map5095: float | None,
    clip: tuple[float, float] = (0.0, 5.0),
    gate_map: float | None = 0.30,
    ema_prev: float | None = None,
    ema_decay: float | None = None,
) -> ReportedUFM:
    """u_i from a raw UFM: optional EMA (on the raw value), then clip to [a, b], then the mAP gate (u = b).

    EMA: ema = decay * ema_prev + (1 - decay) * raw, started at raw when ema_prev is None.
    Gate: when map5095 < gate_map the client reports b; gate_map=None disables it.
    """
    a, b = (float(v) for v in clip)
    if not a <= b:
        raise ValueError(f"clip must satisfy a <= b, got clip=({a}, {b})")
    if not math.isfinite(raw):
        raise ValueError(f"raw UFM must be finite, got {raw}")
    if ema_decay is None:
        if ema_prev is not None:
            raise ValueError("ema_prev given but ema_decay is None; pass ema_decay to use the EMA")
        ema = None
        value = float(raw)
    else:
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must lie in [0, 1), got {ema_decay}")
        if ema_prev is not None and not math.isfinite(ema_prev):
            raise ValueError(f"ema_prev must be finite, got {ema_prev}")
        ema = float(raw) if ema_prev is None else ema_decay * float(ema_prev) + (1.0 - ema_decay) * float(raw)
        value = ema
    u = min(max(value, a), b)
    if gate_map is not None:
        if map5095 is None or math.isnan(map5095):
            raise ValueError(f"map5095 must be a number when gate_map={gate_map} is set, got {map5095}")
        if map5095 < gate_map:
            u = b
    return ReportedUFM(u=u, ema=ema)


# ---- cohorts for label-free and partial-label UFM (one id per ground-truth person / sample) ----


def _as_long(name: str, values: Any) -> Tensor:
    t = torch.as_tensor(values).detach().cpu()
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer group ids, got dtype {t.dtype}")
    return t.long().reshape(-1)


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def cohorts_kmeans(features: Any, k: int, seed: int = 0) -> Tensor:
    """AF-UFM-Cluster: k-means (scikit-learn) on L2-normalised features (n, d) -> cohort id per row."""
    from sklearn.cluster import KMeans

    x = torch.as_tensor(features).detach().double().cpu().numpy()
    if x.ndim != 2:
        raise ValueError(f"features must have shape (n, d), got {x.shape}")
    if not 1 <= k <= x.shape[0]:
        raise ValueError(f"k must lie in 1..n={x.shape[0]}, got {k}")
    if not np.isfinite(x).all():
        raise ValueError("features contain NaN or inf")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x / np.maximum(norms, 1e-12)
    labels = KMeans(n_clusters=k, random_state=seed, n_init=10).fit_predict(x)
    return torch.from_numpy(labels.astype(np.int64))


def cohorts_vacuity_slices(vacuity: Any, k: int) -> Tensor:
    """AF-UFM-Slices: k quantile strata of vacuity 1/alpha0 (stratum 0 = most evidence).

    Strata are rank-based so sizes differ by at most one; +inf (an undetected person) sorts into the top stratum.
    """
    v = torch.as_tensor(vacuity).detach().double().cpu().reshape(-1)
    n = v.numel()
    if not 1 <= k <= max(n, 1):
        raise ValueError(f"k must lie in 1..n={n}, got {k}")
    if torch.isnan(v).any() or (v == -math.inf).any():
        raise ValueError("vacuity contains NaN or -inf")
    order = torch.argsort(v, stable=True)
    ids = torch.empty(n, dtype=torch.long)
    ids[order] = torch.arange(n) * k // n
    return ids


def cohorts_proxy(values: Sequence[Any] | np.ndarray) -> Tensor:
    """AF-UFM-Proxy: map a non-sensitive proxy column (e.g. lighting) to ids 0..K-1 in sorted order; None/NaN -> -1."""
    vals = list(values.tolist() if isinstance(values, (np.ndarray, Tensor)) else values)

    def missing(v: Any) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    levels = sorted({v for v in vals if not missing(v)})
    index = {v: i for i, v in enumerate(levels)}
    return torch.tensor([-1 if missing(v) else index[v] for v in vals], dtype=torch.long)


def drop_group_labels(groups: Any, p: float, seed: int = 0) -> Tensor:
    """Partial labels: set round(p * n_known) randomly chosen known group labels to -1."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    g = _as_long("groups", groups).clone()
    known = torch.nonzero(g >= 0).flatten()
    n_drop = round(p * known.numel())
    chosen = known[torch.randperm(known.numel(), generator=_rng(seed))[:n_drop]]
    g[chosen] = -1
    return g


def flip_group_labels(groups: Any, eta: float, num_groups: int, seed: int = 0) -> Tensor:
    """Noisy labels: each known label flips with probability eta to a uniformly drawn *different* group."""
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must lie in [0, 1], got {eta}")
    if num_groups < 2:
        raise ValueError(f"num_groups must be >= 2 to flip labels, got {num_groups}")
    g = _as_long("groups", groups).clone()
    if g.numel() and (g.min() < -1 or g.max() >= num_groups):
        raise ValueError(f"groups must lie in -1..{num_groups - 1}, got range {int(g.min())}..{int(g.max())}")
    gen = _rng(seed)
    flip = (torch.rand(g.numel(), generator=gen, dtype=torch.float64) < eta) & (g >= 0)
    # An offset in 1..G-1 modulo G reaches every other group with equal probability and never the same one.
    offset = torch.randint(1, num_groups, (g.numel(),), generator=gen)
    g[flip] = (g[flip] + offset[flip]) % num_groups
    return g
