"""Black-box shadow-model membership inference (SPEC §7): per-sample features, a calibrated attack, its metrics.

Model-agnostic: callers run the target / shadow models and pass their outputs as arrays. The attack is trained only
on shadow members / non-members (never on the target's own members: SPEC §9).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import sklearn
from sklearn.calibration import CalibratedClassifierCV
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score, roc_curve
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.class_weight import compute_sample_weight

DETECTION_FEATURE_NAMES = ("n_dets", "mean_score", "max_score", "mean_alpha0", "mean_u_cls", "loss", "logit_margin")
CLASSIFICATION_FEATURE_NAMES = ("max_prob", "entropy", "alpha0", "u_cls", "loss", "margin")
FPR_TARGETS = (0.01, 0.05, 0.10)


class ProbabilisticClassifier(Protocol):
    def predict_proba(self, x: np.ndarray) -> np.ndarray: ...


def _to_numpy(x: Any, name: str) -> np.ndarray:
    """Tensor / array-like -> float64 numpy array (detached, on CPU)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: cannot convert to a float array ({exc})") from exc


def _check_1d(x: np.ndarray, n: int, name: str) -> np.ndarray:
    x = x.reshape(-1) if x.ndim == 2 and x.shape[1] == 1 else x
    if x.ndim != 1 or x.shape[0] != n:
        raise ValueError(f"{name}: expected shape ({n},), got {tuple(x.shape)}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name}: contains non-finite values at rows {np.flatnonzero(~np.isfinite(x))[:10].tolist()}")
    return x


def detection_mia_features(
    per_image_preds: Sequence[Mapping[str, Any]],
    per_image_losses: Sequence[float] | np.ndarray,
    per_image_margins: Sequence[float] | np.ndarray,
) -> np.ndarray:
    """Per-image MIA features (n, 7): [#dets, mean score, max score, mean alpha0, mean u_cls, loss, logit margin].

    `per_image_preds[i]` is a post-NMS prediction dict (CONVENTIONS: "scores", "alpha0", optional "u_cls"; u_cls
    defaults to 1/(alpha0+1) as in SPEC §1). An image with no detections gets 0 for #dets and for the four detection
    statistics (no evidence at all); its loss and margin columns still come from the inputs.
    """
    n = len(per_image_preds)
    losses = _check_1d(_to_numpy(per_image_losses, "per_image_losses"), n, "per_image_losses")
    margins = _check_1d(_to_numpy(per_image_margins, "per_image_margins"), n, "per_image_margins")
    feats = np.zeros((n, len(DETECTION_FEATURE_NAMES)), dtype=np.float64)
    for i, pred in enumerate(per_image_preds):
        for key in ("scores", "alpha0"):
            if key not in pred:
                raise ValueError(f"per_image_preds[{i}]: missing key {key!r} (have {sorted(pred)})")
        scores = _to_numpy(pred["scores"], f"per_image_preds[{i}]['scores']").reshape(-1)
        alpha0 = _to_numpy(pred["alpha0"], f"per_image_preds[{i}]['alpha0']").reshape(-1)
        if "u_cls" in pred:
            u_cls = _to_numpy(pred["u_cls"], f"per_image_preds[{i}]['u_cls']").reshape(-1)
        else:
            u_cls = 1.0 / (alpha0 + 1.0)
        if not (scores.shape == alpha0.shape == u_cls.shape):
            raise ValueError(
                f"per_image_preds[{i}]: scores/alpha0/u_cls lengths differ "
                f"({scores.shape[0]}, {alpha0.shape[0]}, {u_cls.shape[0]})"
            )
        if scores.size:
            feats[i, :5] = [scores.size, scores.mean(), scores.max(), alpha0.mean(), u_cls.mean()]
    feats[:, 5] = losses
    feats[:, 6] = margins
    if not np.all(np.isfinite(feats)):
        bad = np.flatnonzero(~np.isfinite(feats).all(axis=1))[:10].tolist()
        raise ValueError(f"detection_mia_features: non-finite predictions for images {bad}")
    return feats


def classification_mia_features(
    probs: Any,
    alpha0: Any | None,
    losses: Any,
) -> np.ndarray:
    """Per-sample MIA features (n, 6): [max prob, entropy, alpha0, u_cls, loss, margin (top-1 minus top-2 prob)].

    `alpha0=None` (a non-evidential softmax model) leaves the alpha0 and u_cls columns at zero.
    """
    p = _to_numpy(probs, "probs")
    if p.ndim != 2 or p.shape[1] < 2:
        raise ValueError(f"probs: expected shape (n, C) with C >= 2, got {tuple(p.shape)}")
    n = p.shape[0]
    if not np.all(np.isfinite(p)) or np.any(p < 0) or not np.allclose(p.sum(axis=1), 1.0, atol=1e-3):
        bad = np.flatnonzero(~(np.isfinite(p).all(1) & (p >= 0).all(1) & np.isclose(p.sum(1), 1.0, atol=1e-3)))
        raise ValueError(f"probs: rows {bad[:10].tolist()} are not probability vectors")
    loss = _check_1d(_to_numpy(losses, "losses"), n, "losses")
    top2 = np.sort(p, axis=1)[:, -2:]
    entropy = -np.sum(p * np.log(np.clip(p, 1e-12, None)), axis=1)
    feats = np.zeros((n, len(CLASSIFICATION_FEATURE_NAMES)), dtype=np.float64)
    feats[:, 0] = top2[:, 1]
    feats[:, 1] = entropy
    if alpha0 is not None:
        a0 = _check_1d(_to_numpy(alpha0, "alpha0"), n, "alpha0")
        feats[:, 2] = a0
        feats[:, 3] = 1.0 / (a0 + 1.0)
    feats[:, 4] = loss
    feats[:, 5] = top2[:, 1] - top2[:, 0]
    return feats


def _stack_membership(member_feats: Any, nonmember_feats: Any, who: str) -> tuple[np.ndarray, np.ndarray]:
    m = _to_numpy(member_feats, f"{who} member features")
    nm = _to_numpy(nonmember_feats, f"{who} non-member features")
    for arr, name in ((m, "member"), (nm, "non-member")):
        if arr.ndim != 2 or arr.shape[0] == 0:
            raise ValueError(f"{who} {name} features: expected a non-empty (n, d) array, got {tuple(arr.shape)}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{who} {name} features: non-finite values in rows "
                             f"{np.flatnonzero(~np.isfinite(arr).all(1))[:10].tolist()}")
    if m.shape[1] != nm.shape[1]:
        raise ValueError(f"{who}: member features have {m.shape[1]} columns, non-members {nm.shape[1]}")
    x = np.concatenate([m, nm], axis=0)
    y = np.concatenate([np.ones(len(m), dtype=np.int64), np.zeros(len(nm), dtype=np.int64)])
    return x, y


def fit_membership_attack(
    shadow_member_feats: Any,
    shadow_nonmember_feats: Any,
    seed: int,
    method: str = "sigmoid",
) -> CalibratedClassifierCV:
    """Calibrated StandardScaler + LogisticRegression on shadow members (1) vs non-members (0), classes balanced.

    Balancing uses "balanced" sample weights for both the base model and the calibrator (metadata routing), so a
    0.5 threshold corresponds to equal member / non-member priors whatever the shadow set sizes.
    """
    if method not in ("sigmoid", "isotonic"):
        raise ValueError(f"method must be 'sigmoid' or 'isotonic', got {method!r}")
    x, y = _stack_membership(shadow_member_feats, shadow_nonmember_feats, "shadow")
    if min(int(y.sum()), int((1 - y).sum())) < 3:
        raise ValueError(f"shadow: need >= 3 members and non-members for cv=3, got {int(y.sum())}/{int((1 - y).sum())}")
    weights = compute_sample_weight("balanced", y)
    with sklearn.config_context(enable_metadata_routing=True):
        pipe = make_pipeline(
            StandardScaler().set_fit_request(sample_weight=True),
            LogisticRegression(max_iter=2000).set_fit_request(sample_weight=True),
        )
        attack = CalibratedClassifierCV(pipe, method=method, cv=StratifiedKFold(3, shuffle=True, random_state=seed))
        attack.fit(x, y, sample_weight=weights)
    return attack


def tpr_at_fpr(labels: np.ndarray, scores: np.ndarray, target_fpr: float) -> float:
    """Largest TPR on the full empirical ROC with FPR <= target_fpr (conservative: no interpolation)."""
    if not 0.0 <= target_fpr <= 1.0:
        raise ValueError(f"target_fpr must be in [0, 1], got {target_fpr}")
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    ok = fpr <= target_fpr + 1e-12
    return float(tpr[ok].max())  # the (0, 0) point is always present, so `ok` is never empty


def membership_metrics_from_scores(
    member_scores: Any,
    nonmember_scores: Any,
    seed: int,
    threshold: float = 0.5,
) -> dict[str, float | int]:
    """SR (balanced accuracy at `threshold` on a seeded 50/50 subsample), AUC and TPR@FPR 1/5/10% from scores."""
    ms = _to_numpy(member_scores, "member_scores").reshape(-1)
    ns = _to_numpy(nonmember_scores, "nonmember_scores").reshape(-1)
    if ms.size == 0 or ns.size == 0:
        raise ValueError(f"need members and non-members, got {ms.size} and {ns.size}")
    if not (np.all(np.isfinite(ms)) and np.all(np.isfinite(ns))):
        raise ValueError("membership scores contain non-finite values")
    # Balanced evaluation: subsample the larger side (seeded) so SR is not driven by the class ratio.
    rng = np.random.default_rng([seed, 0x4D4941])
    k = min(ms.size, ns.size)
    ms_bal = ms if ms.size == k else ms[rng.choice(ms.size, size=k, replace=False)]
    ns_bal = ns if ns.size == k else ns[rng.choice(ns.size, size=k, replace=False)]
    tpr_bal = float(np.mean(ms_bal >= threshold))
    tnr_bal = float(np.mean(ns_bal < threshold))
    labels = np.concatenate([np.ones(ms.size), np.zeros(ns.size)])
    scores = np.concatenate([ms, ns])
    out: dict[str, float | int] = {
        "success_rate": 0.5 * (tpr_bal + tnr_bal),
        "auc": float(roc_auc_score(labels, scores)),
    }
    for t in FPR_TARGETS:
        out[f"tpr_at_fpr_{round(t * 100)}"] = tpr_at_fpr(labels, scores, t)
    out["n_members"] = int(ms.size)
    out["n_nonmembers"] = int(ns.size)
    out["n_balanced_per_class"] = int(k)
    return out


def evaluate_membership_attack(
    attack: ProbabilisticClassifier,
    member_feats: Any,
    nonmember_feats: Any,
    seed: int,
) -> dict[str, float | int]:
    """Apply a fitted attack to target-model features (members: client train data; non-members: reserve).

    Returns success_rate, auc, tpr_at_fpr_1, tpr_at_fpr_5, tpr_at_fpr_10, n_members, n_nonmembers,
    n_balanced_per_class. AUC and TPR@FPR use every sample; success_rate uses the balanced subsample.
    """
    x, y = _stack_membership(member_feats, nonmember_feats, "target")
    proba = np.asarray(attack.predict_proba(x))
    if proba.ndim != 2 or proba.shape != (len(x), 2):
        raise ValueError(f"attack.predict_proba returned shape {proba.shape}, expected ({len(x)}, 2)")
    scores = proba[:, 1]
    return membership_metrics_from_scores(scores[y == 1], scores[y == 0], seed)
