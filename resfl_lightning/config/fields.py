"""Typed config sections: a dataclass per config node, each field declared with `setting(...)` (default, one-line
doc, range or choices). `Section.__post_init__` checks every field against its type and metadata, then the
section's own cross-key rules; `build` turns a plain mapping (the resolved Hydra node) into a section, naming any
unknown, missing or mistyped key with its full dotted path.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, ClassVar

from resfl_lightning.config.errors import ConfigError

MISSING = dataclasses.MISSING


def setting(default: Any = MISSING, doc: str = "", *, ge: float | None = None, gt: float | None = None,
            le: float | None = None, lt: float | None = None, choices: tuple | None = None) -> Any:
    """A dataclass field with its doc and constraints; no default = the key is required. Bounds and choices apply to
    the value, or to each item of a list."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices}
    if default is MISSING:
        return dataclasses.field(metadata=meta)
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def prefixed(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> type:
    """A dataclass mixin with the fields of dataclass `cls` (but `skip`) named prefix + name, their types, defaults
    and metadata unchanged: a flat section declares another class's settings as its keys without copying them."""
    specs = [(prefix + f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory,
                                                           metadata=f.metadata))
             for f in dataclasses.fields(cls) if f.name not in skip]
    mixin = dataclasses.make_dataclass(f"{prefix}{cls.__name__}", specs, kw_only=True)
    mixin.__module__ = cls.__module__  # the fields' annotations are resolved in cls's module
    return mixin


class Unresolved:
    """A placeholder for an interpolated value: one whose interpolation failed (reported only if nothing else fails,
    so a bad choice that broke an interpolation is named itself), or any interpolated value while the values written
    out are checked first (config/load.py). Type, range and rule checks skip it."""

    def __init__(self, key: str, message: str) -> None:
        self.key, self.message = key, message

    def __repr__(self) -> str:
        return f"<unresolved: {self.message}>"


def has_unresolved(value: Any) -> bool:
    if isinstance(value, Unresolved):
        return True
    if isinstance(value, Mapping):
        return any(has_unresolved(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_unresolved(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(has_unresolved(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


class Section:
    """Mixin of every config dataclass. `section` is the node's dotted key (errors say "<section>.<field>: ...");
    `checks` are functions (config/rules.py) run on the built section for rules that tie several of its keys."""

    section: ClassVar[str] = ""
    checks: ClassVar[tuple[Callable[[Any], None], ...]] = ()

    def __post_init__(self) -> None:
        check_fields(self)
        if has_unresolved(self):  # the rules would compare placeholders; the unresolved value is reported later
            return
        for rule in type(self).checks:
            rule(self)


def key_of(section: str, name: str) -> str:
    return f"{section}.{name}" if section else name


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _arms(tp: Any) -> tuple:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def matches(tp: Any, value: Any) -> bool:
    """Strict: no bool for a number, no string for a number, no NaN / inf for a float."""
    if tp is Any:
        return True
    if len(_arms(tp)) > 1:
        return any(matches(arm, value) for arm in _arms(tp))
    if tp is type(None) or tp is None:
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple):
        item = args[0] if args else Any
        return isinstance(value, (list, tuple)) and all(matches(item, v) for v in value)
    if origin is dict:
        item = args[1] if len(args) == 2 else Any
        return isinstance(value, Mapping) and all(isinstance(k, str) and matches(item, v) for k, v in value.items())
    return isinstance(value, tp)


def describe(tp: Any) -> str:
    arms = _arms(tp)
    if len(arms) > 1:
        names = [describe(a) for a in arms if a is not type(None)]
        return " or ".join(names + (["null"] if type(None) in arms else []))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple):
        return f"a list ({describe(args[0]) if args else 'any value'} each)"
    if origin is dict:
        return "a mapping"
    names = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string", Any: "any value"}
    if tp in names:
        return names[tp]
    return f"a mapping of {tp.__name__} settings" if dataclasses.is_dataclass(tp) else f"a {tp.__name__}"


def _numbers(value: Any) -> list:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _bounds_text(meta: Mapping) -> str:
    lo = f"[{meta['ge']}" if meta["ge"] is not None else f"({meta['gt']}" if meta["gt"] is not None else None
    hi = f"{meta['le']}]" if meta["le"] is not None else f"{meta['lt']})" if meta["lt"] is not None else None
    if lo and hi:
        return f"lie in {lo}, {hi}"
    if lo:
        return f"be {'>=' if lo[0] == '[' else '>'} {lo[1:]}"
    return f"be {'<=' if hi[-1] == ']' else '<'} {hi[:-1]}"


def _in_bounds(v: float, meta: Mapping) -> bool:
    return ((meta["ge"] is None or v >= meta["ge"]) and (meta["gt"] is None or v > meta["gt"])
            and (meta["le"] is None or v <= meta["le"]) and (meta["lt"] is None or v < meta["lt"]))


def _raise_item_error(key: str, tp: Any, value: Any) -> None:
    """A list or mapping of the right kind with one bad item: name the item."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple) and isinstance(value, (list, tuple)) and args:
        bad = next((i for i, v in enumerate(value) if not matches(args[0], v)), None)
        if bad is not None:
            raise ConfigError(f"{key}: item {bad} must be {describe(args[0])}, got {value[bad]!r}", key)
    if origin is dict and isinstance(value, Mapping) and len(args) == 2:
        bad = next((k for k, v in value.items() if not (isinstance(k, str) and matches(args[1], v))), None)
        if bad is not None:
            where = f"{key}.{bad}"
            raise ConfigError(f"{where}: must be {describe(args[1])}, got {value[bad]!r}", where)


def check_value(key: str, tp: Any, meta: Mapping, value: Any) -> None:
    """Type, then choices, then range of one field; ConfigError "<key>: ..." on the first that fails."""
    if has_unresolved(value):
        return
    if not matches(tp, value):
        _raise_item_error(key, tp, value)
        raise ConfigError(f"{key}: must be {describe(tp)}, got {value!r}", key)
    if meta.get("choices") is not None and value is not None:
        items = value if isinstance(value, (list, tuple)) else [value]
        bad = [v for v in items if v not in meta["choices"]]
        if bad:
            raise ConfigError(f"{key}: must be one of {', '.join(map(str, meta['choices']))}; got {bad[0]!r}", key)
    if any(meta.get(b) is not None for b in ("ge", "gt", "le", "lt")):
        bad = [v for v in _numbers(value) if not _in_bounds(v, meta)]
        if bad:
            raise ConfigError(f"{key}: must {_bounds_text(meta)}, got {bad[0]!r}", key)


def check_fields(obj: Any) -> None:
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        check_value(key_of(type(obj).section, f.name), hints[f.name], f.metadata, getattr(obj, f.name))


def locate(target: Any, base: type, key: str) -> type:
    """The class a `_target_` names; it must be a dataclass subclass of `base`."""
    module_name, _, name = target.rpartition(".") if isinstance(target, str) else ("", "", "")
    if not module_name or not name:
        raise ConfigError(f"{key}._target_: must name a {base.__name__} class as 'module.Class', got {target!r}")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except Exception as err:  # noqa: BLE001 - importing runs the module's code: any failure names the target
        raise ConfigError(f"{key}._target_: cannot import {target!r}: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, base) and dataclasses.is_dataclass(cls)):
        raise ConfigError(f"{key}._target_: {target} is not a {base.__module__}.{base.__name__} dataclass")
    return cls


def _dataclass_in(tp: Any) -> type | None:
    return next((a for a in _arms(tp) if isinstance(a, type) and dataclasses.is_dataclass(a)), None)


def build(cls: type, values: Any, key: str) -> Any:
    """An instance of `cls` (or of the subclass its `_target_` names) from a plain mapping; nested sections are
    built the same way. Unknown and missing keys are ConfigErrors naming the full key."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{key}: must be a mapping of settings, got {values!r}", key)
    init = {f.name: f for f in dataclasses.fields(cls) if f.init}
    if "_target_" in init:  # the class to build, and so the keys to expect, come from the node
        if "_target_" not in values:
            raise ConfigError(f"{key_of(key, '_target_')}: missing; name the {cls.__name__} class as 'module.Class'")
        cls = locate(values["_target_"], cls, key)
        init = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in values if k not in init)
    if unknown:
        where = key_of(key, unknown[0])
        raise ConfigError(f"{where}: unknown key; {cls.__name__} has {', '.join(init)}", where)
    hints, kwargs = _hints(cls), {}
    for name, f in init.items():
        where = key_of(key, name)
        if name in values:
            value, sub = values[name], _dataclass_in(hints[name])
            kwargs[name] = build(sub, value, where) if sub is not None and isinstance(value, Mapping) else value
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"{where}: missing; {f.metadata.get('doc') or 'required'}", where)
    return cls(**kwargs)


def checked_dataclass(cls: type, values: Mapping[str, Any], path: str) -> Any:
    """cls(**values) for a plain dataclass (a plug-in's settings or parameters), type-checked by OmegaConf against its
    fields; an unknown or mistyped key is a ConfigError naming `path`.<key>. __post_init__ runs as usual."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), values))
    except OmegaConfBaseException as err:
        raise ConfigError(f"{path}.{err.full_key}: {str(err.msg).splitlines()[0]}") from None
