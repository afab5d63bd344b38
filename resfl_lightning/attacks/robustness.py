"""Robustness attacks inside a run: the Byzantine update transform and the data-poisoning wrapper."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from resfl_lightning.attacks.byzantine import attacker_report, byzantine_transform, choose_attackers, strength
from resfl_lightning.attacks.poisoning import is_poison_round, poison_annotations, poisoned_clients
from resfl_lightning.attacks.settings import ByzantineSettings, PoisoningSettings
from resfl_lightning.attacks.targets import stream_seed
from resfl_lightning.config import ConfigError
from resfl_lightning.data.partition import count_from_fraction

_POISON_SEED_STREAM = 0x504F53



# --- Byzantine ----------------------------------------------------------------------------------------------------
class ByzantineUpdate:
    """Update transform (client_id, round_idx, delta) -> delta: the round's attackers send -gamma * delta, optionally
    rescaled to an l2 bound; attackers are drawn per round from (seed, round) (byzantine.choose_attackers).

    `report` is the orchestrator's hook for what a client reports beside its update (byzantine.attacker_report);
    `clip_low` is the lowest u the server accepts (ufm.clip_low), what a lying attacker reports; `gamma` is the
    number settings.gamma stands for (byzantine.strength)."""

    def __init__(self, num_clients: int, settings: ByzantineSettings, seed: int, mask: torch.Tensor | None = None,
                 clip_low: float = 0.0):
        self.num_clients, self.settings, self.seed, self.mask = num_clients, settings, seed, mask
        self.clip_low = clip_low
        self.gamma = self.resolve("gamma", settings.gamma)

    def resolve(self, key: str, value: float | str) -> float:
        """The number a strength key stands for at this attack's n (clients) and f (attackers)."""
        f = count_from_fraction(self.num_clients, self.settings.fraction)
        if isinstance(value, str) and f == 0:
            return 1.0  # no attacker ever sends: the relative strength is never used
        try:
            return strength(value, self.num_clients, f)
        except ValueError as err:
            raise ConfigError(f"attack.byzantine.{key}={value}: {err}") from None

    def report(self, client_id: int, round_idx: int, honest: Any, validate_sent: Callable[[], Any],
               report_u: Callable[[float, float], tuple[float, float, bool]]) -> tuple[Any, tuple[float, float, bool]]:
        """(evaluation, (EMA, u, gated)) this client reports: honest for non-attackers, the mode's for attackers."""
        mode = self.settings.report if client_id in self.attackers(round_idx) else "honest"
        return attacker_report(mode, honest, validate_sent, report_u, self.clip_low)

    def attackers(self, round_idx: int) -> list[int]:
        return choose_attackers(self.num_clients, self.settings.fraction, self.seed, round_idx)

    def __call__(self, client_id: int, round_idx: int, delta: torch.Tensor) -> torch.Tensor:
        if client_id not in self.attackers(round_idx):
            return delta
        s = self.settings
        if self.mask is None:
            return byzantine_transform(delta, self.gamma, s.l2_bound)
        mask = self.mask.to(delta.device)
        if mask.numel() != delta.numel():
            raise ValueError(f"Byzantine mask has {mask.numel()} entries, the update {delta.numel()}")
        out = delta.clone()
        out[mask] = byzantine_transform(delta[mask], self.gamma, s.l2_bound)
        return out


# --- data poisoning ----------------------------------------------------------------------------------------------
@dataclass
class _AnnotatedView:
    """The same images as `source` with replaced annotations (the poisoned client's view)."""

    source: Any
    annotations: Any

    def __len__(self) -> int:
        return len(self.source)

    def load_image(self, i: int) -> np.ndarray:
        return self.source.load_image(i)


class AttackDataWrapper:
    """Federated data wrapped by a data attack: reads it does not override go to `base` (attacks/targets.py
    base_data unwraps it); a callback sets `round_idx` at each round start."""

    is_attack_wrapper = True

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (e.g. during unpickling): avoid infinite recursion
            raise AttributeError(name)
        return getattr(self.base, name)

    def set_round(self, round_idx: int) -> None:
        self.round_idx = int(round_idx)


class PoisonedData(AttackDataWrapper):
    """Federated data whose poisoned clients train on poisoned annotations inside the poisoning block.

    Everything else (validation, test, reserve, other clients, rounds outside the block) is the wrapped data. The
    block counts rounds: [start_round, start_round + length) -- i.e. length x local_epochs local epochs. The poisoned
    client set is fixed for the run (poisoning.poisoned_clients). A callback sets `round_idx` at each round start.
    """

    def __init__(self, base: Any, settings: PoisoningSettings, seed: int, rounds: int):
        self.base, self.settings, self.seed = base, settings, seed
        self.length = rounds if settings.length is None else settings.length
        self.clients = poisoned_clients(base.num_clients, settings.fraction, seed)
        self.round_idx = 0
        self._views: dict[int, tuple[Any, dict]] = {}
        s = settings
        if not 0 <= s.target_group < base.num_groups:
            raise ConfigError(f"attack.poisoning.target_group must lie in 0..{base.num_groups - 1}, "
                              f"got {s.target_group}")
        self.detection = hasattr(base, "source") and hasattr(base.source, "annotations")
        if not (dataclasses.is_dataclass(base) and (self.detection or hasattr(base, "y"))):
            raise NotImplementedError(f"data poisoning for {type(base).__name__}: supported for detection data "
                                      "(annotations) and tabular data (x, y, groups)")
        lowest = 1 if self.detection else 0  # detection: class 0 is the person class being skewed
        if s.mode == "mislabel" and not (s.mislabel_class is not None
                                         and lowest <= s.mislabel_class < base.num_classes):
            raise ConfigError(f"attack.poisoning.mode=mislabel needs mislabel_class in {lowest}.."
                              f"{base.num_classes - 1}; this dataset has {base.num_classes} class(es)"
                              + (" (use mode=drop or relabel_group)" if base.num_classes <= lowest else ""))
        if s.mode == "relabel_group" and not (s.other_group is not None and 0 <= s.other_group < base.num_groups
                                              and s.other_group != s.target_group):
            raise ConfigError(f"attack.poisoning.mode=relabel_group needs other_group in 0..{base.num_groups - 1}, "
                              f"different from target_group {s.target_group}")

    def active(self, client_id: int) -> bool:
        s = self.settings
        return client_id in self.clients and is_poison_round(self.round_idx, s.start_round, self.length)

    def poisoned(self, client_id: int) -> tuple[Any, dict]:
        """(data view with the client's poisoned training annotations, poisoning summary); cached per client."""
        if client_id not in self._views:
            self._views[client_id] = (self._detection_view if self.detection else self._tabular_view)(client_id)
        return self._views[client_id]

    def _poison(self, arrays: dict[str, np.ndarray], client_id: int, person_class: int) -> tuple[dict, dict]:
        s = self.settings
        return poison_annotations(arrays, s.target_group, s.mode, s.rate,
                                  seed=stream_seed(self.seed, _POISON_SEED_STREAM, client_id),
                                  other_group=s.other_group, mislabel_class=s.mislabel_class,
                                  person_class=person_class)

    def _detection_view(self, client_id: int) -> tuple[Any, dict]:
        """The client's training images keep their pixels; their annotation rows are replaced."""
        base = self.base
        ann = base.source.annotations
        rows = np.isin(ann.image_index, base.splits.clients[client_id].train)
        sub = ann.select(rows)
        arrays = {"image_index": sub.image_index, "cls": sub.cls, "boxes": sub.boxes, "groups": sub.groups,
                  "proxy": sub.proxy, **{f"extra/{k}": v for k, v in sub.extra.items()}}
        new, summary = self._poison(arrays, client_id, person_class=0)
        rest = ann.select(~rows)
        extra = {k: np.concatenate([rest.extra[k], new[f"extra/{k}"]]) for k in rest.extra}
        merged = type(ann)(np.concatenate([rest.image_index, new["image_index"]]),
                           np.concatenate([rest.cls, new["cls"]]), np.concatenate([rest.boxes, new["boxes"]]),
                           np.concatenate([rest.groups, new["groups"]]), np.concatenate([rest.proxy, new["proxy"]]),
                           extra)
        return dataclasses.replace(base, source=_AnnotatedView(base.source, merged)), summary

    def _tabular_view(self, client_id: int) -> tuple[Any, dict]:
        """One row per sample: drop removes the rows from the client's training split, mislabel sets their label to
        mislabel_class, relabel_group their group to other_group."""
        base = self.base
        train = np.asarray(base.splits.clients[client_id].train, np.int64)
        y, groups = base.y.clone(), base.groups.clone()
        arrays = {"image_index": train, "cls": y[train].numpy(), "boxes": np.zeros((len(train), 4), np.float32),
                  "groups": groups[train].numpy()}
        new, summary = self._poison(arrays, client_id, person_class=-1)  # every class id is a valid target
        if self.settings.mode == "drop":
            clients = list(base.splits.clients)
            clients[client_id] = dataclasses.replace(clients[client_id], train=new["image_index"])
            return dataclasses.replace(base, splits=dataclasses.replace(base.splits, clients=clients)), summary
        y[train] = torch.as_tensor(new["cls"], dtype=y.dtype)
        groups[train] = torch.as_tensor(new["groups"], dtype=groups.dtype)
        return dataclasses.replace(base, y=y, groups=groups), summary

    def train_loader(self, client_id: int, seed: int):
        if not self.active(client_id):
            return self.base.train_loader(client_id, seed)
        return self.poisoned(client_id)[0].train_loader(client_id, seed)
