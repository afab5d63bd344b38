"""Build the attack callbacks from the composed `attack` config node: no list of attack names anywhere.

Every key of `attack` whose value holds a `_target_` is an attack: the target (an `Attack` subclass,
resfl_lightning/attacks/base.py) is imported, its `Settings` dataclass is filled from the node's other keys (typed:
an unknown key or a wrong type is a ConfigError naming attack.<name>.<key>) and `build` gives its callback. The
remaining keys are the group's options (`AttackOptions`). Config groups compose: `attack=[privacy,byzantine]`
merges both yamls, so both sets of attacks run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from resfl_lightning.attacks.base import Attack, AttackRun
from resfl_lightning.attacks.scores import AttackScores
from resfl_lightning.config import ConfigError
from resfl_lightning.config.fields import checked_dataclass


@dataclass
class AttackOptions:
    """attack.enabled and attack.every: the keys of `attack` that are not attacks."""

    enabled: list[str] | None = None  # null: every configured attack; a list: only those (e.g. [mia,aia,eod])
    every: int | None = None  # periodic attacks (MIA, AIA, update-aware AIA) also run every k rounds

    def __post_init__(self) -> None:
        if self.every is not None and self.every < 1:
            raise ConfigError(f"attack.every: must be null or >= 1, got {self.every}")


@dataclass(frozen=True)
class ConfiguredAttack:
    name: str  # its key under `attack`
    attack: type[Attack]
    settings: Any  # an instance of attack.Settings


def _attack_class(target: Any, path: str) -> type[Attack]:
    try:
        cls = get_class(str(target))
    except Exception as err:  # noqa: BLE001 - Hydra raises ImportError / ValueError / AttributeError alike
        raise ConfigError(f"{path}._target_: cannot import {target!r} ({err})") from None
    if not (isinstance(cls, type) and issubclass(cls, Attack)):
        raise ConfigError(f"{path}._target_: {target!r} is not an Attack subclass (resfl_lightning/attacks/base.py)")
    if not is_dataclass(getattr(cls, "Settings", None)):
        raise ConfigError(f"{path}._target_: {target!r} has no `Settings` dataclass for the node's keys")
    return cls


def read_attacks(node: Any) -> tuple[AttackOptions, list[ConfiguredAttack]]:
    """The group options and every configured attack (settings checked), in config order; None: no `attack` node."""
    if node is None:
        return AttackOptions(), []
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    attacks, options = [], {}
    for name, value in values.items():
        if isinstance(value, Mapping) and "_target_" in value:
            path = f"attack.{name}"
            cls = _attack_class(value["_target_"], path)
            settings = checked_dataclass(cls.Settings, {k: v for k, v in value.items() if k != "_target_"}, path)
            attacks.append(ConfiguredAttack(name, cls, settings))
        elif name in {f.name for f in fields(AttackOptions)}:
            options[name] = value
        else:
            raise ConfigError(f"attack.{name}: neither an attack (a node with a `_target_`) nor an option "
                              f"({[f.name for f in fields(AttackOptions)]})")
    return checked_dataclass(AttackOptions, options, "attack"), attacks


def selected(options: AttackOptions, attacks: list[ConfiguredAttack]) -> list[ConfiguredAttack]:
    """The attacks that run: all configured ones, or those attack.enabled names."""
    if options.enabled is None:
        return attacks
    names = [a.name for a in attacks]
    unknown = [n for n in options.enabled if n not in names]
    if unknown:
        raise ConfigError(f"attack.enabled: {unknown} not configured; the attack config defines {names} "
                          "(select more with attack=[privacy,byzantine,...])")
    return [a for a in attacks if a.name in options.enabled]


def build_attack_callbacks(cfg: Any, evaluation: Any = None) -> list:
    """The attack callbacks of the run, in their order (`Attack.order`), then AttackScores; [] when none runs.
    `evaluation` is the run's GlobalEvaluation, whose test pass the EOD measurement reuses."""
    options, attacks = read_attacks(cfg.attack)
    chosen = selected(options, attacks)
    if not chosen:
        return []
    run = AttackRun(seed=int(cfg.seed), rounds=int(cfg.federation.rounds), every=options.every,
                    evaluation=evaluation, settings={a.name: a.settings for a in attacks})
    callbacks: list = []
    for a in sorted(chosen, key=lambda a: a.attack.order):
        callback = a.attack.build(a.settings, run)
        if not any(callback is c for c in callbacks):  # attacks sharing one callback (MIA + AIA) add it once
            callbacks.append(callback)
    callbacks.append(AttackScores())  # last: reads what the attacks and the global evaluation added
    return callbacks
