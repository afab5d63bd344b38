"""Robustness attacks wired into the round loop (docs/method.md §7) and the EOD measurement their comparison needs.

ByzantineAttack: adds the Byzantine update transform (sign flip, scaling, Gaussian, ALIE, IPM, min-max, min-sum,
their calibrated forms, the adaptive attacks on resfl_robust, label flip; attackers fixed for the run or redrawn per
round: attacks/byzantine_round.py) to the Federation.
DataPoisoning: wraps the federated data so the poisoned clients train on skewed annotations during the block.
EqualizedOdds: EOD of the global model on the test split, from the predictions of the global evaluation's pass of
that round (no second inference pass), whenever the global evaluation ran.
BA AD and DPA EODD compare two runs: `resfl compare CLEAN_RUN OTHER_RUN`.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

from resfl_lightning.attacks.base import Attack, AttackRun
from resfl_lightning.attacks.byzantine_round import ByzantineAttackSettings, ByzantineRound, LabelFlippedData
from resfl_lightning.attacks.robustness import ByzantineUpdate, PoisonedData
from resfl_lightning.attacks.settings import EodSettings, PoisoningSettings
from resfl_lightning.attacks.targets import minority_group
from resfl_lightning.config import ConfigError
from resfl_lightning.data.federated import base_data
from resfl_lightning.evaluation.evaluation_pass import eod_from_pass


class ByzantineAttack(Attack):
    """attack.byzantine."""

    Settings = ByzantineAttackSettings
    order = 10

    def __init__(self, settings: ByzantineAttackSettings, seed: int):
        self.settings, self.seed = settings, int(seed)
        self.transform: ByzantineRound | None = None

    @classmethod
    def build(cls, settings: ByzantineAttackSettings, run: AttackRun) -> ByzantineAttack:
        return cls(settings, seed=run.seed)

    def on_fit_start(self, federation, model, layout) -> None:
        mask = None if self.settings.include_buffers else layout.parameter_mask(model)
        self.transform = ByzantineRound(federation.data.num_clients, self.settings, self.seed, mask,
                                        clip_low=model.ufm.clip_low, rule=federation.aggregator)
        # Replace (not stack) a transform left from an earlier fit of the same Federation.
        federation.update_transforms = [t for t in federation.update_transforms if not isinstance(t, ByzantineUpdate)]
        federation.update_transforms.append(self.transform)
        if self.settings.kind == "label_flip" and not isinstance(federation.data, LabelFlippedData):
            federation.data = LabelFlippedData(federation.data, self.transform)

    def on_round_start(self, federation, round_idx: int) -> None:
        if isinstance(federation.data, LabelFlippedData):
            federation.data.set_round(round_idx)

    def on_round_end(self, federation, round_idx: int, weights: dict, metrics: dict) -> None:
        attackers = self.transform.attackers(round_idx)
        metrics["attack/byzantine_num_attackers"] = float(len(attackers))
        # The share of the round's aggregation weight the attackers received (the rule's logged weights).
        metrics["attack/byzantine_weight_share"] = float(sum(w for cid, w in weights.items() if cid in attackers))
        if self.transform.calibrated is not None and self.transform.calibrated[0] == round_idx:
            found = self.transform.calibrated[1]  # the strength the search chose and how far it moved the aggregate
            metrics["attack/byzantine_strength"] = float(found.strength)
            metrics["attack/byzantine_deviation"] = float(found.deviation)
        if self.transform.adaptive is not None and self.transform.adaptive[0] == round_idx:
            # the cosine with the attackers' estimate of the root update they aimed at
            metrics["attack/byzantine_strength"] = float(self.transform.adaptive[1])
        for cid in range(federation.data.num_clients):
            metrics[f"attack/byzantine/client_{cid}"] = float(cid in attackers)


class DataPoisoning(Attack):
    """attack.poisoning."""

    Settings = PoisoningSettings
    order = 20

    def __init__(self, settings: PoisoningSettings, seed: int, rounds: int):
        self.settings, self.seed, self.rounds = settings, int(seed), int(rounds)

    @classmethod
    def build(cls, settings: PoisoningSettings, run: AttackRun) -> DataPoisoning:
        return cls(settings, seed=run.seed, rounds=run.rounds)

    def on_fit_start(self, federation) -> None:
        if not isinstance(federation.data, PoisonedData):
            federation.data = PoisonedData(federation.data, self.settings, self.seed, self.rounds)

    def on_round_start(self, federation, round_idx: int) -> None:
        federation.data.set_round(round_idx)

    def on_round_end(self, federation, round_idx: int, metrics: dict) -> None:
        data: PoisonedData = federation.data
        active = [cid for cid in data.clients if data.active(cid)]
        metrics["attack/poisoning_num_clients"] = float(len(data.clients))
        metrics["attack/poisoning_active_clients"] = float(len(active))
        metrics["attack/poisoning_boxes"] = float(sum(data.poisoned(cid)[1]["n_poisoned"] for cid in active))


class EqualizedOdds(Attack):
    """attack.eod: test/eod (+ its four rates) between the protected group and the others (metrics/eod.py for the
    reading).

    `evaluation` is the run's GlobalEvaluation callback, whose pass over the test split the EOD reuses."""

    Settings = EodSettings
    order = 50

    def __init__(self, protected_group: int | None, unprotected_group: int | None = None, evaluation=None):
        self.protected = None if protected_group is None else int(protected_group)
        self.unprotected = unprotected_group
        self.evaluation = evaluation
        self._warned = False

    @classmethod
    def build(cls, settings: EodSettings, run: AttackRun) -> EqualizedOdds:
        protected = settings.protected_group
        if protected is None and "poisoning" in run.settings:  # the group the poisoning targets
            protected = run.settings["poisoning"].target_group
        return cls(protected, settings.unprotected_group, evaluation=run.evaluation)

    def on_fit_start(self, federation) -> None:
        g = base_data(federation.data).num_groups
        if self.protected is None:  # a dataset without a declared protected group (dataset=csv / yolo default)
            kept = getattr(self.evaluation, "min_group_size", 1)  # a group the metrics leave out cannot be measured
            self.protected = minority_group(federation.data, min_test_size=kept)
            if federation.fabric.is_global_zero:
                among = f" measured on the test split (metrics.min_group_size={kept})" if kept > 1 else ""
                print(f"attack.eod: protected group {self.protected}, the smallest group of the data{among} "
                      "(dataset.protected_group=null)", flush=True)
        for key, value in (("protected_group", self.protected), ("unprotected_group", self.unprotected)):
            if value is not None and not 0 <= value < g:
                raise ConfigError(f"attack.eod.{key}={value} is not a group of this dataset (0..{g - 1})")
        if self.unprotected == self.protected:
            raise ConfigError(f"attack.eod.unprotected_group equals protected_group ({self.protected})")

    def _warn(self, why: str) -> None:
        if not self._warned:
            warnings.warn(f"EOD undefined on the test split: {why}", stacklevel=3)
            self._warned = True

    def on_round_end(self, federation, round_idx: int, model, metrics: dict) -> None:
        if not federation.fabric.is_global_zero:
            return
        if self.evaluation is None:
            raise RuntimeError("EqualizedOdds needs the run's GlobalEvaluation (its test pass) as `evaluation`")
        evaluated = self.evaluation.evaluation_pass(round_idx)
        if evaluated is None:
            return  # only on rounds where the global evaluation ran
        left_out = [g for g in (self.protected, self.unprotected) if g in evaluated.groups_excluded]
        if left_out:  # EOD undefined: the group is too small on the test split to be measured
            self._warn(f"group {left_out[0]} has {evaluated.groups_excluded[left_out[0]]} units in the test split, "
                       f"fewer than metrics.min_group_size")
            return
        try:
            res = eod_from_pass(model, evaluated, base_data(federation.data).num_groups, self.protected,
                                self.unprotected)
        except ValueError as err:  # a side without positives / persons in the test split: EOD undefined, say so once
            self._warn(str(err))
            return
        metrics["test/eod"] = res.pop("eod")
        metrics.update({f"test/eod_{k}": v for k, v in res.items()})
        metrics["test/eod_protected_group"] = float(self.protected)
        if evaluated.decision is not None:  # PrivFairFL-Post: the raw rule's EOD too, beside its other raw metrics
            raw = eod_from_pass(model, replace(evaluated, decision=None), base_data(federation.data).num_groups,
                                self.protected, self.unprotected)
            metrics["test/uncalibrated/eod"] = raw["eod"]
