"""Groups named by value: `dataset.protected_group=Black` (or an attack key below) is turned into the group's index
in the dataset's group order (FederatedDataset.group_names) before the config is checked, so every key downstream,
the attacks' interpolations of dataset.protected_group included, holds an index as before.

A config that names no group by value is returned as it is: today's configs (indices, null) build exactly as they
did. The run keeps the config as composed (with the name) in its config.yaml, so a later command with the same
overrides composes the same config (analysis/run_settings.py).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf

from resfl_lightning.config.errors import ConfigError

# The keys that name one group. The attack keys interpolate dataset.protected_group unless a command sets them.
GROUP_KEYS = ("dataset.protected_group", "attack.eod.protected_group", "attack.eod.unprotected_group",
              "attack.poisoning.target_group", "attack.poisoning.other_group")


def listing(names: Sequence[str]) -> str:
    return ", ".join(f"{i}={name}" for i, name in enumerate(names))


def group_index(value: str, names: Sequence[str] | None, key: str) -> int:
    """The index of the group named `value`; ConfigError naming the key and listing the groups otherwise."""
    if names is None:
        raise ConfigError(f"{key}: {value!r} is a name, but this dataset numbers its groups without names; give the "
                          "group's index", key)
    if value in names:
        return list(names).index(value)
    raise ConfigError(f"{key}: {value!r} is not a group of this data; its groups are {listing(names)} (give a name "
                      "or an index)", key)


def named_groups(cfg: DictConfig) -> dict[str, str]:
    """{key: value} of the GROUP_KEYS that hold a name (a string) rather than an index or null."""
    out = {}
    for key in GROUP_KEYS:
        value = OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)
        if isinstance(value, str):
            out[key] = value
    return out


def _with(cfg: DictConfig, values: dict[str, int | None]) -> DictConfig:
    out = copy.deepcopy(cfg)
    for key, value in values.items():
        OmegaConf.update(out, key, value, merge=False)
    return out


def with_group_indices(cfg: DictConfig) -> DictConfig:
    """`cfg` itself when no group key holds a name; otherwise a copy with each name replaced by its index. The rest
    of the config is checked first (with null in place of the names), then the dataset's group names are read."""
    named = named_groups(cfg)
    if not named:
        return cfg
    from resfl_lightning.data.federated import instantiate_dataset
    from resfl_lightning.run_config.load import load_config

    checked = load_config(_with(cfg, dict.fromkeys(named)))
    dataset = instantiate_dataset(checked.dataset)
    dataset.preflight()
    names = dataset.group_names(checked.seed)
    return _with(cfg, {key: group_index(value, names, key) for key, value in named.items()})
