"""What an attack plugs into: the class its config node's `_target_` names, the run it is built for, and where its
callback writes its files.

An attack is one module + one yaml (docs/design.md, "Adding an attack"). The module defines a settings dataclass,
the function that does the work, and an `Attack` subclass, usually the callback itself:

    @dataclass
    class MySettings:                      # the keys of attack.<name>, with their defaults
        strength: float = 1.0

    class MyAttack(Attack):
        Settings = MySettings
        order = 60                         # where its callback runs among the attacks' (see `Attack.order`)

        @classmethod
        def build(cls, settings: MySettings, run: AttackRun) -> MyAttack:
            return cls(settings, run.seed)

        def on_round_end(self, federation, round_idx, model, metrics): ...   # decide when, call the function, log

and conf/attack/<name>.yaml holds `<name>: {_target_: pkg.module.MyAttack, strength: 1.0}`, selected with
`attack=<name>` or beside others with `attack=[privacy,<name>]` (resfl_lightning/attacks/registry.py builds it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

T = TypeVar("T")


def attack_due(round_idx: int, rounds: int, every: int | None) -> bool:
    """Rounds a periodic attack runs at: the last round, and every `every` rounds when set (attack.every)."""
    return round_idx == rounds - 1 or (every is not None and (round_idx + 1) % every == 0)


@dataclass(frozen=True)
class AttackRun:
    """The run an attack's callback is built for."""

    seed: int
    rounds: int
    every: int | None  # attack.every: periodic attacks also run every k rounds (always after the last round)
    evaluation: Any  # the run's GlobalEvaluation: its test pass serves the attacks that need test predictions
    settings: Mapping[str, Any]  # every configured attack's checked settings by its key under `attack`
    _shared: dict[type, Any] = field(default_factory=dict, repr=False)

    def shared(self, kind: type[T], make: Callable[[], T]) -> T:
        """One callback of `kind` for this run, made on first request: attacks that run together share it."""
        if kind not in self._shared:
            self._shared[kind] = make()
        return self._shared[kind]


class Attack:
    """An attack selectable from config: attack.<name>._target_ names a subclass.

    `Settings` is the dataclass the node's other keys fill (unknown keys and wrong types are errors naming the
    key). `order` places the attack's callback among the attacks' (ascending; ties keep config order): attacks that
    change what clients train on or send run first (Byzantine 10, poisoning 20), then those that attack the model
    or its updates (MIA / AIA 30, update-aware AIA 40), then measurements on the evaluation pass (EOD 50). The
    scores that combine their metrics (AttackScores) always run after every attack.
    """

    Settings: ClassVar[type]
    order: ClassVar[int] = 100

    @classmethod
    def build(cls, settings: Any, run: AttackRun) -> Any:
        """The Fabric callback that runs this attack (one object may serve several attacks: `AttackRun.shared`)."""
        raise NotImplementedError(f"{cls.__name__} must define build(settings, run)")


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
