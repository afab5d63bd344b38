"""The honest-but-curious server's privacy attacks on a global model (docs/method.md §7), as callable protocols.

MIA (black-box, shadow model): the attack reserve is cut (stratified by group, seeded) into shadow members, shadow
non-members and held-back target non-members. A shadow client trained with the run's recipe on the shadow members
gives labelled features; the attack (mia.fit_membership_attack) learns and sets its thresholds on them alone and is
scored on the global model with target members drawn from real client training sets, as many as the held-back
non-members. attack.mia.method = lira | rmia replaces the shadow by reference models on the shadow rows and scores
the same target members and non-members per example (attacks/reference_mia.py); attack.mia.audit = lira | rmia runs
that beside the shadow attack on the same split, its keys attack/mia_audit_*. Representation AIA: neck features
ROI-aligned at the global model's matched detections on the reserve images -> the class-balanced MLP probe (70/10/20
inside the reserve) predicting the person's group.
Privacy Score = (MIA balanced accuracy + AIA balanced accuracy) / 2 (the shadow MIA's: NaN under lira / rmia).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from resfl_lightning.attacks.aia import aia_success_rate, train_attribute_probe
from resfl_lightning.attacks.mia import (
    CLASSIFICATION_FEATURE_NAMES,
    DETECTION_FEATURE_NAMES,
    MIN_SHADOW_PER_SIDE,
    evaluate_membership_attack,
    fit_membership_attack,
)
from resfl_lightning.attacks.mia_keys import audit_key
from resfl_lightning.attacks.outputs import mia_features, representation_features
from resfl_lightning.attacks.reference_mia import reference_membership_inference
from resfl_lightning.attacks.references import ReferenceModels
from resfl_lightning.attacks.settings import AiaSettings, MiaSettings
from resfl_lightning.attacks.targets import (
    ReserveSplit,
    ShadowModel,
    item_groups,
    sample_members,
    split_reserve,
)
from resfl_lightning.config.errors import ConfigError
from resfl_lightning.data.federated import base_data
from resfl_lightning.evaluation.weather import weather_loader
from resfl_lightning.metrics.fairness import privacy_score

LoaderFor = Callable[[np.ndarray], Any]  # item indices -> an evaluation loader over them
AIA_SCORES = ("balanced_accuracy", "top1", "macro_f1", "chance_uniform", "chance_majority")


@dataclass
class PrivacyPlan:
    """What the attacks fixed at the start of the run: which attacks (those with settings), the reserve split, the
    members, the shadow (method shadow) or the reference models (lira / rmia)."""

    seed: int
    mia: MiaSettings | None
    aia: AiaSettings | None
    split: ReserveSplit | None = None
    members: np.ndarray | None = None
    shadow: ShadowModel | None = None
    references: ReferenceModels | None = None


def plan_privacy_attacks(federation: Any, seed: int, mia: MiaSettings | None,
                         aia: AiaSettings | None) -> PrivacyPlan:
    """Cut the reserve, draw the target members and set up the shadow model; fail now if the reserve is too small."""
    plan = PrivacyPlan(int(seed), mia, aia)
    data = base_data(federation.data)
    reserve = np.asarray(data.splits.reserve, np.int64)
    if mia is not None:
        plan.split = split_reserve(reserve, item_groups(data), mia, plan.seed)
        sizes = {k: len(getattr(plan.split, k)) for k in ("shadow_members", "shadow_nonmembers", "target_nonmembers")}
        if min(sizes.values()) < MIN_SHADOW_PER_SIDE:
            raise ConfigError(f"dataset.reserve_fraction: the attack reserve of {len(reserve)} items is too small for "
                              f"the MIA split {sizes} (need >= {MIN_SHADOW_PER_SIDE} each): raise "
                              "dataset.reserve_fraction or the dataset size")
        plan.members = sample_members(data, sizes["target_nonmembers"], plan.seed)
        if mia.method == "shadow":
            plan.shadow = ShadowModel(federation, plan.split.shadow_members, plan.seed)
        if mia.reference_method is not None:  # the pool: the shadow rows, never a target member or held-back non-member
            pool = np.concatenate([plan.split.shadow_members, plan.split.shadow_nonmembers])
            plan.references = ReferenceModels(federation, pool, mia.references, plan.seed)
    if aia is not None and hasattr(data, "source") and hasattr(data.source, "annotations"):
        ann = data.source.annotations
        known = int(((ann.groups >= 0) & np.isin(ann.image_index, reserve)).sum())
        if known < 10:
            raise ConfigError(f"dataset.reserve_fraction: the attack reserve holds {known} persons with a known group; "
                              "the AIA probe needs >= 10 (raise dataset.reserve_fraction)")
    return plan


def membership_inference(plan: PrivacyPlan, federation: Any, model: Any, round_idx: int,
                         loader_for: LoaderFor) -> tuple[dict[str, float], dict[str, Any]]:
    """attack/mia_* metrics of the global model after round `round_idx`, and the details for the attack file."""
    if plan.mia.method != "shadow":
        return reference_membership_inference(plan, federation, model, round_idx, loader_for, plan.mia.method)
    t0 = time.perf_counter()
    fabric, tau, split = federation.fabric, plan.mia.score_threshold, plan.split
    shadow = plan.shadow.advance(round_idx + 1)
    s_in = mia_features(shadow, loader_for(split.shadow_members), fabric, tau)
    s_out = mia_features(shadow, loader_for(split.shadow_nonmembers), fabric, tau)
    attack = fit_membership_attack(s_in, s_out, plan.seed, method=plan.mia.calibration)
    t_in = mia_features(model, loader_for(plan.members), fabric, tau)
    t_out = mia_features(model, loader_for(split.target_nonmembers), fabric, tau)
    target = evaluate_membership_attack(attack, t_in, t_out, plan.seed)
    names = DETECTION_FEATURE_NAMES if s_in.shape[1] == len(DETECTION_FEATURE_NAMES) else CLASSIFICATION_FEATURE_NAMES
    details = {
        "target": target, "shadow_test": attack.shadow_test, "feature_names": list(names),
        "threshold": attack.threshold, "fpr_thresholds": {str(k): v for k, v in attack.fpr_thresholds.items()},
        "shadow_split_sizes": attack.split_sizes, "shadow_rounds": plan.shadow.rounds_done,
        "split_sizes": {"shadow_members": len(split.shadow_members), "shadow_nonmembers": len(split.shadow_nonmembers),
                        "target_nonmembers": len(split.target_nonmembers), "target_members": len(plan.members)},
        "feature_means": {"shadow_members": s_in.mean(0), "shadow_nonmembers": s_out.mean(0),
                          "target_members": t_in.mean(0), "target_nonmembers": t_out.mean(0)},
    }
    metrics = {f"attack/mia_{k}": float(v) for k, v in target.items()}
    metrics["attack/mia_shadow_success_rate"] = float(attack.shadow_test["success_rate"])
    metrics["attack/mia_time"] = time.perf_counter() - t0
    return metrics, details


def attribute_inference(plan: PrivacyPlan, federation: Any, model: Any,
                        loader_for: LoaderFor) -> tuple[dict[str, float], dict[str, Any]]:
    """attack/aia_* metrics (representation AIA on the reserve), and the details for the attack file."""
    t0 = time.perf_counter()
    data, a = base_data(federation.data), plan.aia
    rep = representation_features(model, loader_for(data.splits.reserve), federation.fabric, a.boxes,
                                  a.score_threshold, a.min_matched)
    p = a.probe
    res = train_attribute_probe(rep["features"], rep["groups"], data.num_groups, plan.seed, hidden=p.hidden,
                                dropout=p.dropout, lr=p.lr, epochs=p.epochs, batch_size=p.batch_size)
    details = {**res, "source": rep["source"], "n_matched": rep["n_matched"], "n_samples": len(rep["groups"])}
    metrics = {f"attack/aia_{k}": float(res[k]) for k in AIA_SCORES}
    metrics.update({
        "attack/aia_success_rate": aia_success_rate(res),
        "attack/aia_n_samples": float(len(rep["groups"])), "attack/aia_n_matched": float(rep["n_matched"]),
        "attack/aia_matched_boxes": float(rep["source"] == "matched"),
        "attack/aia_time": time.perf_counter() - t0,
    })
    return metrics, details


def privacy_attacks(plan: PrivacyPlan, federation: Any, model: Any, round_idx: int,
                    loader_for: LoaderFor | None = None,
                    audit: bool = True) -> tuple[dict[str, float], dict[str, Any]]:
    """Every planned attack on the global model: (attack/* metrics, {"round", "mia", "mia_audit", "aia"} details).

    `loader_for` defaults to the data's evaluation loader; the weather evaluation passes corrupted-image loaders and
    audit=False (its rows have no audit column).
    """
    loader_for = loader_for or base_data(federation.data).loader_for
    metrics: dict[str, float] = {}
    details: dict[str, Any] = {"round": round_idx}
    if plan.mia is not None:
        m, details["mia"] = membership_inference(plan, federation, model, round_idx, loader_for)
        metrics.update(m)
        if audit and plan.mia.audit is not None:
            m, details["mia_audit"] = reference_membership_inference(plan, federation, model, round_idx, loader_for,
                                                                     plan.mia.audit)
            metrics.update({audit_key(k): v for k, v in m.items()})
    if plan.aia is not None:
        m, details["aia"] = attribute_inference(plan, federation, model, loader_for)
        metrics.update(m)
    return metrics, details


def condition_row(metrics: dict[str, float]) -> dict[str, float]:
    """The weather table's privacy columns from one condition's attack/* metrics."""
    keys = ["mia_success_rate", "mia_auc", *[f"aia_{k}" for k in AIA_SCORES], "aia_n_samples"]
    row = {k: metrics[f"attack/{k}"] for k in keys if f"attack/{k}" in metrics}
    if "mia_success_rate" in row and "aia_balanced_accuracy" in row:
        row["privacy_score"] = privacy_score(row["mia_success_rate"], row["aia_balanced_accuracy"])
    return row


def weather_privacy_metrics(plan: PrivacyPlan, federation: Any, model: Any, round_idx: int,
                            seed: int) -> Callable[[str, int, Any], dict[str, float]]:
    """Per-condition attacks for the weather table: every image the attacks touch (shadow and target members /
    non-members, reserve) corrupted like the test images; the MIA is refitted on the shadow's corrupted outputs."""
    data = base_data(federation.data)

    def metrics(condition: str, intensity: int, _test_loader: Any) -> dict[str, float]:
        def loader_for(indices: np.ndarray) -> Any:
            return weather_loader(data, indices, condition, intensity, seed)

        return condition_row(privacy_attacks(plan, federation, model, round_idx, loader_for, audit=False)[0])

    return metrics
