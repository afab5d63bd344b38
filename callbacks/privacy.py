"""Privacy attacks against the global model (SPEC §7) and the Privacy / Fairness Scores (SPEC §6), on rank 0.

MIA (black-box, shadow model): the attack reserve is cut (stratified by group, seeded) into shadow members, shadow
non-members and held-back target non-members. A shadow client trained with the run's recipe on the shadow members
gives labelled features for a calibrated logistic regression; the attack is then scored on the global model with
target members drawn from real client training sets, as many as the held-back non-members (balanced).
Representation AIA: neck features ROI-aligned at the global model's matched detections on the attack-reserve
images -> the two-layer MLP probe (70/10/20 split inside the reserve) predicting the person's group.
With the weather evaluation on, `condition_metrics` re-runs both attacks on corrupted images for each condition.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from resfl_lightning.attacks.aia import aia_success_rate, train_attribute_probe
from resfl_lightning.attacks.mia import (
    CLASSIFICATION_FEATURE_NAMES,
    DETECTION_FEATURE_NAMES,
    evaluate_membership_attack,
    fit_membership_attack,
)
from resfl_lightning.attacks.outputs import mia_features, representation_features
from resfl_lightning.attacks.settings import AttackSettings
from resfl_lightning.attacks.targets import ShadowModel, base_data, item_groups, sample_members, split_reserve
from resfl_lightning.evaluation.weather import ExtraMetrics, weather_loader
from resfl_lightning.metrics.fairness import fairness_score, privacy_score

MIN_PER_SIDE = 3  # the calibrated attack uses 3-fold CV: at least 3 shadow members and 3 shadow non-members


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(float(v))


def write_attack_file(federation, name: str, payload: dict) -> Path:
    """run_dir/attacks/<name>.json (rank 0 callers only)."""
    path = Path(federation.settings.run_dir) / "attacks" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)

    def default(o):
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"not JSON-serialisable: {type(o).__name__}")

    path.write_text(json.dumps(payload, indent=2, sort_keys=True, default=default))
    return path


class PrivacyAttacks:
    """Runs the MIA and/or the representation AIA after the last round (and every `attack.every` rounds)."""

    def __init__(self, settings: AttackSettings, seed: int, mia: bool = True, aia: bool = True):
        self.settings, self.seed, self.run_mia, self.run_aia = settings, int(seed), mia, aia
        self.split = None
        self.members: np.ndarray | None = None
        self.shadow: ShadowModel | None = None

    def on_fit_start(self, federation, state) -> None:
        if not federation.fabric.is_global_zero:
            return
        data = base_data(federation.data)
        reserve = np.asarray(data.splits.reserve, np.int64)
        if self.run_mia:
            self.split = split_reserve(reserve, item_groups(data), self.settings.mia, self.seed)
            sizes = {k: len(getattr(self.split, k)) for k in ("shadow_members", "shadow_nonmembers",
                                                              "target_nonmembers")}
            if min(sizes.values()) < MIN_PER_SIDE:
                raise ValueError(f"attack reserve of {len(reserve)} items is too small for the MIA split {sizes} "
                                 f"(need >= {MIN_PER_SIDE} each): raise dataset.reserve_fraction or the dataset size")
            self.members = sample_members(data, sizes["target_nonmembers"], self.seed)
            self.shadow = ShadowModel(federation, self.split.shadow_members, self.seed)
        if self.run_aia and hasattr(data, "source") and hasattr(data.source, "annotations"):
            ann = data.source.annotations
            known = int(((ann.groups >= 0) & np.isin(ann.image_index, reserve)).sum())
            if known < 10:
                raise ValueError(f"attack reserve holds {known} persons with a known group; the AIA probe needs >= 10 "
                                 "(raise dataset.reserve_fraction)")

    def on_round_end(self, federation, round_idx: int, model, metrics: dict) -> None:
        if not federation.fabric.is_global_zero or not self.settings.due(round_idx, federation.settings.rounds):
            return
        results: dict[str, float] = {}
        details: dict = {"round": round_idx}
        if self.run_mia:
            results.update(self._mia(federation, model, round_idx, details))
        if self.run_aia:
            results.update(self._aia(federation, model, details))
        metrics.update(results)
        write_attack_file(federation, f"privacy_round_{round_idx:04d}", {"metrics": results, **details})

    def condition_metrics(self, federation, model, round_idx: int, seed: int) -> ExtraMetrics:
        """Per-condition attacks for the weather table: every image the attacks touch (shadow and target members /
        non-members, reserve) corrupted like the test images; the MIA is refitted on the shadow's corrupted outputs.
        Row keys: mia_success_rate, mia_auc, aia_top1, aia_chance_rate, aia_n_samples (persons the probe saw),
        privacy_score = (MIA SR + AIA SR)/2."""
        data = base_data(federation.data)

        def metrics(condition: str, intensity: int, _test_loader) -> dict[str, float]:
            def loader_for(indices):
                return weather_loader(data, indices, condition, intensity, seed)

            out: dict[str, float] = {}
            if self.run_mia:
                mia = self._mia(federation, model, round_idx, {}, loader_for)
                out.update(mia_success_rate=mia["attack/mia_success_rate"], mia_auc=mia["attack/mia_auc"])
            if self.run_aia:
                aia = self._aia(federation, model, {}, loader_for)
                out.update(aia_top1=aia["attack/aia_top1"], aia_chance_rate=aia["attack/aia_chance_rate"],
                           aia_n_samples=aia["attack/aia_n_samples"])
            if self.run_mia and self.run_aia:
                out["privacy_score"] = privacy_score(out["mia_success_rate"], out["aia_top1"])
            return out

        return metrics

    def _mia(self, federation, model, round_idx: int, details: dict, loader_for=None) -> dict[str, float]:
        t0 = time.perf_counter()
        data, fabric, tau = base_data(federation.data), federation.fabric, self.settings.mia.score_threshold
        loader_for = loader_for or data.loader_for
        shadow = self.shadow.advance(round_idx + 1)
        s_in = mia_features(shadow, loader_for(self.split.shadow_members), fabric, tau)
        s_out = mia_features(shadow, loader_for(self.split.shadow_nonmembers), fabric, tau)
        attack = fit_membership_attack(s_in, s_out, self.seed, method=self.settings.mia.calibration)
        t_in = mia_features(model, loader_for(self.members), fabric, tau)
        t_out = mia_features(model, loader_for(self.split.target_nonmembers), fabric, tau)
        target = evaluate_membership_attack(attack, t_in, t_out, self.seed)
        shadow_fit = evaluate_membership_attack(attack, s_in, s_out, self.seed)  # in-sample: how separable
        names = DETECTION_FEATURE_NAMES if s_in.shape[1] == len(DETECTION_FEATURE_NAMES) else \
            CLASSIFICATION_FEATURE_NAMES
        details["mia"] = {
            "target": target, "shadow_in_sample": shadow_fit, "feature_names": list(names),
            "shadow_rounds": self.shadow.rounds_done,
            "split_sizes": {"shadow_members": len(self.split.shadow_members),
                            "shadow_nonmembers": len(self.split.shadow_nonmembers),
                            "target_nonmembers": len(self.split.target_nonmembers),
                            "target_members": len(self.members)},
            "feature_means": {"shadow_members": s_in.mean(0), "shadow_nonmembers": s_out.mean(0),
                              "target_members": t_in.mean(0), "target_nonmembers": t_out.mean(0)},
        }
        out = {f"attack/mia_{k}": float(v) for k, v in target.items()}
        out["attack/mia_shadow_success_rate"] = float(shadow_fit["success_rate"])
        out["attack/mia_time"] = time.perf_counter() - t0
        return out

    def _aia(self, federation, model, details: dict, loader_for=None) -> dict[str, float]:
        t0 = time.perf_counter()
        data, a = base_data(federation.data), self.settings.aia
        loader_for = loader_for or data.loader_for
        rep = representation_features(model, loader_for(data.splits.reserve), federation.fabric, a.boxes,
                                      a.score_threshold, a.min_matched)
        p = a.probe
        res = train_attribute_probe(rep["features"], rep["groups"], data.num_groups, self.seed, hidden=p.hidden,
                                    dropout=p.dropout, lr=p.lr, epochs=p.epochs, batch_size=p.batch_size)
        details["aia"] = {k: v for k, v in res.items()}
        details["aia"].update(source=rep["source"], n_matched=rep["n_matched"], n_samples=len(rep["groups"]))
        return {
            "attack/aia_top1": res["top1"], "attack/aia_macro_f1": res["macro_f1"],
            "attack/aia_chance_rate": res["chance_rate"], "attack/aia_success_rate": aia_success_rate(res),
            "attack/aia_n_samples": float(len(rep["groups"])), "attack/aia_n_matched": float(rep["n_matched"]),
            "attack/aia_matched_boxes": float(rep["source"] == "matched"),
            "attack/aia_time": time.perf_counter() - t0,
        }


class AttackScores:
    """score/privacy = (MIA SR + AIA SR)/2 and score/fairness = (|1-DI| + Delta-EOP)/2 whenever their inputs exist.

    AIA SR is the representation AIA's top-1 accuracy, or the update-aware AIA's when only that one ran.
    """

    def on_round_end(self, federation, metrics: dict) -> None:
        if not federation.fabric.is_global_zero:
            return
        mia = metrics.get("attack/mia_success_rate")
        aia = metrics.get("attack/aia_success_rate", metrics.get("attack/update_aia_success_rate"))
        if _finite(mia) and _finite(aia):
            metrics["score/privacy"] = privacy_score(mia, aia)
        di, eop = metrics.get("test/abs_one_minus_di"), metrics.get("test/delta_eop")
        if _finite(di) and _finite(eop):
            metrics["score/fairness"] = fairness_score(1.0 - float(di), float(eop))
