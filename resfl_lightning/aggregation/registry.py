"""Build the configured aggregation rule from its `_target_` (conf/aggregation/<rule>.yaml)."""

from __future__ import annotations

from dataclasses import is_dataclass

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from resfl_lightning.aggregation.base import AggregationRule
from resfl_lightning.config import ConfigError
from resfl_lightning.config.fields import checked_dataclass


def _rule_class(target) -> type:
    try:
        cls = get_class(str(target))
    except Exception as err:  # noqa: BLE001 - Hydra raises ImportError / ValueError / AttributeError alike
        raise ConfigError(f"aggregation._target_: cannot import {target!r} ({err})") from None
    if not (isinstance(cls, type) and issubclass(cls, AggregationRule)):
        raise ConfigError(f"aggregation._target_: {target} is not an AggregationRule "
                          "(resfl_lightning/aggregation/base.py)")
    return cls


def build_aggregation(node, report_fim: bool) -> AggregationRule:
    """The rule of the `aggregation` config node; a bad target or parameter is a ConfigError naming the key."""
    if node is None or "_target_" not in node:
        raise ConfigError("aggregation: no rule configured; choose one with aggregation=<rule> (conf/aggregation/)")
    cls = _rule_class(node["_target_"])
    try:
        if is_dataclass(cls):  # typed like any plug-in's keys: an unknown or mistyped parameter is named
            params = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
            rule = checked_dataclass(cls, {k: v for k, v in params.items() if k != "_target_"}, "aggregation")
        else:
            rule = instantiate(node)
    except ConfigError:
        raise
    except (InstantiationException, ValueError) as err:  # the rule's own check of its parameters
        raise ConfigError(f"aggregation ({node['_target_']}): {err.__cause__ or err}") from err
    if rule.needs_fim and not report_fim:
        raise ConfigError(f"algorithm.report_fim: aggregation {rule.name} weighs clients by their Fisher eigenvalue; "
                          "set algorithm.report_fim=true")
    return rule
