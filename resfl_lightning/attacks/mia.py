"""Black-box shadow-model membership inference (docs/method.md §7): per-sample features, a calibrated attack and its
metrics.

Model-agnostic: callers run the target / shadow models and pass their outputs as arrays. Everything the attack
learns or chooses comes from the shadow model's members / non-members, cut 70/10/20 (fit / validation / test):
the calibrated logistic regression is fitted on 70 %, the success-rate threshold is the one that maximises balanced
accuracy on the 10 % validation part, and the thresholds for TPR at FPR 1/5/10 % are set on the held-out shadow
non-members. The target's own members and non-members are only scored (docs/method.md §9); TPR at FPR with
thresholds set on the target's non-members is reported as `oracle_*`, an upper bound no real attacker can reach.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sklearn
from sklearn.calibration import CalibratedClassifierCV
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score, roc_curve
from sklearn.model_selection import StratifiedKFold, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.class_weight import compute_sample_weight

DETECTION_FEATURE_NAMES = ("n_dets", "mean_score", "max_score", "mean_alpha0", "mean_u_cls", "loss", "logit_margin",
                           "mean_dirichlet_var")
CLASSIFICATION_FEATURE_NAMES = ("max_prob", "entropy", "alpha0", "u_cls", "loss", "margin", "dirichlet_var")
FPR_TARGETS = (0.01, 0.05, 0.10)
SHADOW_SPLIT = (0.7, 0.1, 0.2)  # fit / validation (threshold) / test of the shadow members + non-members
MIN_SHADOW_PER_SIDE = 6  # smallest side that still leaves 3 per class for the 3-fold calibration and 1 for validation


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
    """Per-image MIA features (n, 8): [#dets, mean score, max score, mean alpha0, mean u_cls, loss, logit margin,
    mean Dirichlet variance].

    `per_image_preds[i]` is a post-NMS prediction dict (CONVENTIONS: "scores", "alpha0", optional "u_cls"; u_cls
    defaults to 1/(alpha0+1) as in docs/method.md §1). The Dirichlet variance of a detection is that of its class
    probability, p(1 - p)/(alpha0 + 1) with p its score (docs/method.md §1). An image with no detections gets 0 for
    #dets and for the five detection statistics (no evidence at all); its loss and margin columns still come from the
    inputs.
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
            feats[i, 7] = float(np.mean(scores * (1.0 - scores) / (alpha0 + 1.0)))
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
    """Per-sample MIA features (n, 7): [max prob, entropy, alpha0, u_cls, loss, margin (top-1 minus top-2 prob),
    Dirichlet variance of the top class p(1 - p)/(alpha0 + 1)].

    `alpha0=None` (a non-evidential softmax model) leaves the alpha0, u_cls and Dirichlet-variance columns at zero.
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
        feats[:, 6] = top2[:, 1] * (1.0 - top2[:, 1]) / (a0 + 1.0)
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



def _calibrated_attack(x: np.ndarray, y: np.ndarray, seed: int, method: str) -> CalibratedClassifierCV:
    """Calibrated StandardScaler + LogisticRegression, classes balanced for the base model and the calibrator."""
    weights = compute_sample_weight("balanced", y)
    with sklearn.config_context(enable_metadata_routing=True):
        pipe = make_pipeline(
            StandardScaler().set_fit_request(sample_weight=True),
            LogisticRegression(max_iter=2000).set_fit_request(sample_weight=True),
        )
        attack = CalibratedClassifierCV(pipe, method=method, cv=StratifiedKFold(3, shuffle=True, random_state=seed))
        attack.fit(x, y, sample_weight=weights)
    return attack


def choose_threshold(labels: np.ndarray, scores: np.ndarray) -> float:
    """The threshold t (member iff score > t) with the highest balanced accuracy on (labels, scores).

    Candidates are the midpoints between consecutive distinct scores plus one below and one above every score; ties
    go to the candidate closest to 0.5 (the calibrated model's own equal-prior threshold).
    """
    labels, scores = np.asarray(labels).reshape(-1), np.asarray(scores, np.float64).reshape(-1)
    if not (np.any(labels == 1) and np.any(labels == 0)):
        raise ValueError("choose_threshold: need members and non-members")
    u = np.unique(scores)
    candidates = np.concatenate([[u[0] - 1.0], (u[:-1] + u[1:]) / 2, [u[-1] + 1.0]])
    pred = scores[None, :] > candidates[:, None]
    tpr = pred[:, labels == 1].mean(1)
    tnr = (~pred[:, labels == 0]).mean(1)
    ba = 0.5 * (tpr + tnr)
    best = np.flatnonzero(np.isclose(ba, ba.max(), rtol=0, atol=1e-12))
    return float(candidates[best[np.argmin(np.abs(candidates[best] - 0.5))]])


def thresholds_at_fpr(nonmember_scores: np.ndarray, targets: tuple[float, ...] = FPR_TARGETS) -> dict[float, float]:
    """Per target FPR a, the lowest threshold t whose false-positive rate mean(nonmember_scores > t) is <= a:
    the floor(a n)-th largest score (0-based)."""
    ns = np.sort(np.asarray(nonmember_scores, np.float64).reshape(-1))[::-1]
    if ns.size == 0:
        raise ValueError("thresholds_at_fpr: no non-member scores")
    return {a: float(ns[int(np.floor(a * ns.size + 1e-9))]) for a in targets}


@dataclass
class MembershipAttack:
    """A fitted membership attack: the calibrated model, the SR threshold and the TPR@FPR thresholds, all from
    shadow data; plus the shadow validation scores the SR threshold was chosen on and the shadow test metrics."""

    model: CalibratedClassifierCV
    threshold: float
    fpr_thresholds: dict[float, float]
    val_labels: np.ndarray
    val_scores: np.ndarray
    shadow_test: dict[str, float | int]
    split_sizes: dict[str, int] = field(default_factory=dict)

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        return self.model.predict_proba(x)

    def scores(self, x: np.ndarray) -> np.ndarray:
        proba = np.asarray(self.model.predict_proba(x))
        if proba.ndim != 2 or proba.shape != (len(x), 2):
            raise ValueError(f"attack.predict_proba returned shape {proba.shape}, expected ({len(x)}, 2)")
        return proba[:, 1]


def _shadow_split(y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SHADOW_SPLIT (70/10/20) of the shadow rows, stratified by membership, seeded."""
    _, val_frac, test_frac = SHADOW_SPLIT
    idx = np.arange(len(y))
    rest, test = train_test_split(idx, test_size=test_frac, stratify=y, random_state=seed)
    fit, val = train_test_split(rest, test_size=val_frac / (1 - test_frac), stratify=y[rest], random_state=seed)
    return fit, val, test


def fit_membership_attack(
    shadow_member_feats: Any,
    shadow_nonmember_feats: Any,
    seed: int,
    method: str = "sigmoid",
) -> MembershipAttack:
    """Fit the attack on shadow members (1) vs non-members (0) and set every threshold on shadow data alone.

    70 %: the calibrated logistic regression ("balanced" sample weights for base model and calibrator). 10 %: the
    success-rate threshold (choose_threshold). Held-out non-members (the 10 % and the 20 %): the thresholds for
    TPR at FPR 1/5/10 %. 20 %: `shadow_test`, the attack's metrics on shadow rows it never saw.
    """
    if method not in ("sigmoid", "isotonic"):
        raise ValueError(f"method must be 'sigmoid' or 'isotonic', got {method!r}")
    x, y = _stack_membership(shadow_member_feats, shadow_nonmember_feats, "shadow")
    if min(int(y.sum()), int((1 - y).sum())) < MIN_SHADOW_PER_SIDE:
        raise ValueError(f"shadow: need >= {MIN_SHADOW_PER_SIDE} members and non-members for the 70/10/20 split with "
                         f"3-fold calibration, got {int(y.sum())}/{int((1 - y).sum())}")
    fit, val, test = _shadow_split(y, seed)
    model = _calibrated_attack(x[fit], y[fit], seed, method)
    attack = MembershipAttack(model, 0.5, {}, y[val], np.zeros(0), {})
    scores = attack.scores(x)
    attack.val_scores = scores[val]
    attack.threshold = choose_threshold(y[val], scores[val])
    held_out = np.concatenate([val, test])
    attack.fpr_thresholds = thresholds_at_fpr(scores[held_out][y[held_out] == 0])
    attack.shadow_test = membership_metrics_from_scores(scores[test][y[test] == 1], scores[test][y[test] == 0], seed,
                                                        attack.threshold, attack.fpr_thresholds)
    attack.split_sizes = {"fit": int(fit.size), "validation": int(val.size), "test": int(test.size)}
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
    fpr_thresholds: dict[float, float] | None = None,
) -> dict[str, float | int]:
    """Metrics of attack scores (member iff score > threshold).

    success_rate: balanced accuracy at `threshold` on a seeded 50/50 subsample; auc; oracle_tpr_at_fpr_{1,5,10}: the
    ROC read at FPR 1/5/10 % of these very non-members (an upper bound: it sets thresholds on the evaluated
    non-members); with `fpr_thresholds` (set elsewhere, e.g. on shadow non-members) also tpr_at_fpr_{p} and the FPR
    they actually give here, fpr_at_threshold_{p}.
    """
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
    labels = np.concatenate([np.ones(ms.size), np.zeros(ns.size)])
    scores = np.concatenate([ms, ns])
    out: dict[str, float | int] = {
        "success_rate": 0.5 * (float(np.mean(ms_bal > threshold)) + float(np.mean(ns_bal <= threshold))),
        "threshold": float(threshold),
        "auc": float(roc_auc_score(labels, scores)),
    }
    for t in FPR_TARGETS:
        out[f"oracle_tpr_at_fpr_{round(t * 100)}"] = tpr_at_fpr(labels, scores, t)
    for t, thr in (fpr_thresholds or {}).items():
        out[f"tpr_at_fpr_{round(t * 100)}"] = float(np.mean(ms > thr))
        out[f"fpr_at_threshold_{round(t * 100)}"] = float(np.mean(ns > thr))
    out["n_members"] = int(ms.size)
    out["n_nonmembers"] = int(ns.size)
    out["n_balanced_per_class"] = int(k)
    return out


def evaluate_membership_attack(
    attack: MembershipAttack,
    member_feats: Any,
    nonmember_feats: Any,
    seed: int,
) -> dict[str, float | int]:
    """Score a fitted attack on target-model features (members: client train data; non-members: held-back reserve).

    The SR threshold and the TPR@FPR thresholds are the attack's own (shadow data): the target's rows only get
    scored. See membership_metrics_from_scores for the keys.
    """
    x, y = _stack_membership(member_feats, nonmember_feats, "target")
    scores = attack.scores(x)
    return membership_metrics_from_scores(scores[y == 1], scores[y == 0], seed, attack.threshold,
                                          attack.fpr_thresholds)
