"""A composed config node in, its typed object out (the `_target_` class a node names, its keys checked): the whole
run's config goes through here (run_config/load.py), and so does each configured object built from it."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.fields import Unresolved, build, key_of


def plain(node: Any, key: str = "", resolve: bool = True) -> Any:
    """The node as plain dicts / lists. resolve=True: interpolations resolved, and a value that cannot be resolved
    becomes an Unresolved placeholder (so the schema still checks every other key first); resolve=False: every
    interpolated value is a placeholder (the schema then checks only the values written out)."""
    if not isinstance(node, (DictConfig, ListConfig)):
        return node
    names = list(node.keys()) if isinstance(node, DictConfig) else list(range(len(node)))
    out = {}
    for name in names:
        where = key_of(key, str(name)) if isinstance(node, DictConfig) else f"{key}[{name}]"
        if not resolve and OmegaConf.is_interpolation(node, name):
            out[name] = Unresolved(where, "interpolated")
            continue
        try:
            value = node[name]
        except OmegaConfBaseException as err:
            out[name] = Unresolved(where, str(getattr(err, "msg", err)))
            continue
        out[name] = plain(value, where, resolve)
    return out if isinstance(node, DictConfig) else list(out.values())


def _first_unresolved(value: Any) -> Unresolved | None:
    if isinstance(value, Unresolved):
        return value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((u for u in map(_first_unresolved, items) if u is not None), None)


def _raise_unresolved(values: Any) -> None:
    bad = _first_unresolved(values)
    if bad is not None:
        raise ConfigError(f"{bad.key}: cannot be resolved: {bad.message}", bad.key)


def _checked(cls: type, node: Any, key: str) -> Any:
    """build(), first on the values written out (a bad value is named where it was set, not where an
    interpolation copied it to), then on the resolved node."""
    if OmegaConf.is_config(node):
        build(cls, plain(node, key, resolve=False), key)
    values = plain(node, key) if OmegaConf.is_config(node) else node
    obj = build(cls, values, key)
    _raise_unresolved(values)
    return obj


def instantiate(node: Any, base: type, key: str) -> Any:
    """The `base` subclass a config node's `_target_` names, built from the node's keys (typed, ranges checked)."""
    return _checked(base, node, key)
