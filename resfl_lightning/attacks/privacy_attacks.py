"""Privacy attacks against the global model (docs/method.md §7), on rank 0: attack.mia and attack.aia, and the callback
that runs them.

The protocols live in resfl_lightning/attacks/privacy.py; the callback decides when (the last round and every
`attack.every` rounds), runs them on rank 0, merges their metrics and writes run_dir/attacks/privacy_round_*.json.
attack.mia (MembershipInference) and attack.aia (AttributeInference) share one PrivacyAttacks callback, so one
file holds both. With the weather evaluation on, `condition_metrics` re-runs them on corrupted images.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

from resfl_lightning.attacks.aia import used_ground_truth_fallback
from resfl_lightning.attacks.base import Attack, AttackRun, attack_due, write_attack_file
from resfl_lightning.attacks.mia_keys import AUDIT_PREFIX, MIA_PREFIX
from resfl_lightning.attacks.privacy import PrivacyPlan, plan_privacy_attacks, privacy_attacks, weather_privacy_metrics
from resfl_lightning.attacks.settings import AiaSettings, MiaSettings
from resfl_lightning.evaluation.weather import ExtraMetrics


class PrivacyAttacks:
    """Runs the MIA and/or the representation AIA (the ones given) after the last round (and every `every`)."""

    def __init__(self, seed: int, every: int | None = None, mia: MiaSettings | None = None,
                 aia: AiaSettings | None = None):
        self.seed, self.every, self.mia, self.aia = int(seed), every, mia, aia
        self.plan: PrivacyPlan | None = None
        self.fallback_rounds: set[int] = set()  # attack rounds whose AIA probed ground-truth boxes, not matched ones

    @classmethod
    def shared(cls, run: AttackRun) -> PrivacyAttacks:
        """The run's one PrivacyAttacks, which attack.mia and attack.aia both join."""
        return run.shared(cls, lambda: cls(run.seed, run.every))

    def on_fit_start(self, federation, state) -> None:
        if federation.fabric.is_global_zero:
            self.plan = plan_privacy_attacks(federation, self.seed, self.mia, self.aia)
            if state is not None:  # a resumed run counts the fallbacks its earlier attack rounds recorded
                self.fallback_rounds = earlier_fallback_rounds(Path(federation.settings.run_dir), state.round_idx)

    def on_round_end(self, federation, round_idx: int, model, metrics: dict) -> None:
        if not federation.fabric.is_global_zero or not attack_due(round_idx, federation.settings.rounds, self.every):
            return
        results, details = privacy_attacks(self.plan, federation, model, round_idx)
        if self.aia is not None and "aia" in details:
            results.update(self._fallback_metrics(round_idx, details["aia"]))
        if self.mia is not None and self.mia.per_client:  # the per-client scores' attack: the audit's, if one runs
            prefix = MIA_PREFIX if self.mia.audit is None else AUDIT_PREFIX
            if f"{prefix}auc" in results:
                results.update(peak_metrics(Path(federation.settings.run_dir), round_idx, results[f"{prefix}auc"],
                                            prefix))
        metrics.update(results)
        write_attack_file(federation, f"privacy_round_{round_idx:04d}", {"metrics": results, **details})

    def _fallback_metrics(self, round_idx: int, aia: dict) -> dict[str, float]:
        """attack/aia_gt_box_fallback (this round) and attack/aia_gt_box_fallbacks (attack rounds so far), with a
        warning: the switch to ground-truth boxes is never silent."""
        fell_back = used_ground_truth_fallback(self.aia.boxes, aia["source"])
        if fell_back:
            self.fallback_rounds.add(round_idx)
            warnings.warn(f"AIA round {round_idx}: {aia['n_matched']} matched persons < attack.aia.min_matched="
                          f"{self.aia.min_matched}; the probe used the ground-truth person boxes instead", stacklevel=2)
        else:
            self.fallback_rounds.discard(round_idx)
        return {"attack/aia_gt_box_fallback": float(fell_back),
                "attack/aia_gt_box_fallbacks": float(len(self.fallback_rounds))}

    def condition_metrics(self, federation, model, round_idx: int, seed: int) -> ExtraMetrics:
        """Per-condition privacy columns of the weather table (attacks.privacy.weather_privacy_metrics)."""
        return weather_privacy_metrics(self.plan, federation, model, round_idx, seed)


def earlier_attack_files(run_dir: Path, last_round: int) -> dict[int, dict]:
    """Round -> the payload of its privacy attack file, for the rounds <= last_round this run directory holds."""
    out = {}
    for path in sorted((run_dir / "attacks").glob("privacy_round_*.json")):
        match = re.fullmatch(r"privacy_round_(\d+)\.json", path.name)
        if match is not None and int(match.group(1)) <= last_round:
            out[int(match.group(1))] = json.loads(path.read_text())
    return out


def earlier_fallback_rounds(run_dir: Path, last_round: int) -> set[int]:
    """Rounds <= last_round (a resumed run's checkpoint) whose attack file records an AIA ground-truth-box fallback."""
    return {r for r, payload in earlier_attack_files(run_dir, last_round).items()
            if payload.get("metrics", {}).get("attack/aia_gt_box_fallback") == 1.0}


def peak_metrics(run_dir: Path, round_idx: int, auc: float, prefix: str = MIA_PREFIX) -> dict[str, float]:
    """<prefix>peak_round and _auc (prefix attack/mia_, or attack/mia_audit_ for the audit beside the shadow attack):
    the attack round so far (the earlier ones from their files, which a resumed run keeps) whose global AUC of that
    attack is highest (attacks/client_audit.py::peak_round)."""
    from resfl_lightning.attacks.client_audit import peak_round

    key = f"{prefix}auc"
    earlier = earlier_attack_files(run_dir, round_idx - 1)
    aucs = {r: p["metrics"][key] for r, p in earlier.items() if key in p.get("metrics", {})}
    aucs[round_idx] = auc
    peak = peak_round(aucs)
    return {} if peak is None else {f"{prefix}peak_round": float(peak[0]), f"{prefix}peak_round_auc": peak[1]}


class MembershipInference(Attack):
    """attack.mia: the shadow-model membership inference on the global model (runs in PrivacyAttacks)."""

    Settings = MiaSettings
    order = 30

    @classmethod
    def build(cls, settings: MiaSettings, run: AttackRun) -> PrivacyAttacks:
        callback = PrivacyAttacks.shared(run)
        callback.mia = settings
        return callback


class AttributeInference(Attack):
    """attack.aia: the representation attribute inference on the global model (runs in PrivacyAttacks)."""

    Settings = AiaSettings
    order = 30

    @classmethod
    def build(cls, settings: AiaSettings, run: AttackRun) -> PrivacyAttacks:
        callback = PrivacyAttacks.shared(run)
        callback.aia = settings
        return callback
