"""The one entry: a composed Hydra config in, the validated typed config out, before any work starts."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from resfl_lightning.config.load import instantiate
from resfl_lightning.run_config.schema import RunConfig


def load_config(cfg: Any) -> DictConfig:
    """The composed config checked against the schema (run_config/schema.py: every key's type, range, choices; unknown
    keys; the rules of config/rules.py and run_config/rules.py), with every declared default filled in. Raises
    ConfigError "<dotted.key>: ..." before anything is built. The result is a structured DictConfig: attribute access
    gives typed values, and `instantiate(cfg.dataset, ...)` (config/load.py) the configured objects. An already
    loaded config is returned as it is."""
    if isinstance(cfg, DictConfig) and OmegaConf.get_type(cfg) is RunConfig:
        return cfg
    return OmegaConf.structured(instantiate(cfg, RunConfig, ""))
