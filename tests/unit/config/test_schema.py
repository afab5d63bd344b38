"""The config schema stops a bad run before any work: hypothesis draws invalid values (derived from the schema's own
types, ranges and choices), unknown keys and invalid combinations, composes them like the train command and calls
its entry (builders.build_run). Each must raise ConfigError naming the key, with nothing created in run_dir and no
process started."""

from __future__ import annotations

import dataclasses
import math
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from resfl_lightning import builders
from resfl_lightning.config import ConfigError
from resfl_lightning.config.fields import Section, matches, setting
from resfl_lightning.data.datasets.base import FederatedDataset
from resfl_lightning.data.federated import build_federated_data
from resfl_lightning.data.tabular import federated_tabular_data
from resfl_lightning.run_config.load import load_config
from resfl_lightning.run_config.schema import RunConfig
from tests.helpers import compose_config

CONF = Path(__file__).resolve().parents[3] / "conf"
ADULT = ("dataset=adult", "dataset.root=/nonexistent/adult")
# Presets whose typed configs together hold every section class: each dataset's and each algorithm family's keys.
PRESETS = [(), ADULT, ("dataset=carla",), ("dataset=facet",), ("algorithm=fedavg_dp",), ("algorithm=privfairfl_pre",),
           ("algorithm=privfairfl_post",), ("scenario=quality_skew",)]
OPAQUE = ("attack", "aggregation")  # checked by their own registries (attacks, lead), not by this schema
EXAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fields(typed, prefix: str = ""):
    """(dotted key, declared type, field metadata) of every leaf of a loaded config."""
    section = OmegaConf.get_type(typed)
    hints = typing.get_type_hints(section)
    for f in dataclasses.fields(section):
        key = f"{prefix}{f.name}"
        if key in OPAQUE:
            continue
        child = typed[f.name]
        if OmegaConf.is_dict(child) and dataclasses.is_dataclass(OmegaConf.get_type(child)):
            yield from _fields(child, f"{key}.")
        else:
            yield key, hints[f.name], f.metadata


def _rejected(tp: Any, meta: dict, value: Any) -> bool:
    """Whether the schema must refuse `value` (an independent reading of the field's type and metadata)."""
    if not matches(tp, value):
        return True
    items = value if isinstance(value, list) else [value]
    if meta.get("choices") and any(v is not None and v not in meta["choices"] for v in items):
        return True
    numbers = [float(v) for v in items if isinstance(v, (int, float)) and not isinstance(v, bool)]
    limits = {"ge": lambda v, b: v >= b, "gt": lambda v, b: v > b, "le": lambda v, b: v <= b, "lt": lambda v, b: v < b}
    return any(meta.get(k) is not None and not ok(v, meta[k]) for v in numbers for k, ok in limits.items())


def _invalid(tp: Any, meta: dict) -> list[Any]:
    """Values the schema must reject for a field: wrong types, NaN / inf, out of range, not a choice."""
    candidates = ["x-y", 1.5, True, None, math.nan, math.inf, [1.5], {"a": 1}]
    if meta.get("choices"):
        candidates.append("not-a-choice")
    for bound, step in (("ge", -1), ("gt", 0), ("le", 1), ("lt", 0)):
        if meta.get(bound) is not None:
            candidates.append(meta[bound] + step)
    arms = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    kinds = {typing.get_origin(arm) for arm in arms}
    # Hydra itself refuses to merge a mapping into a list node (or the reverse) while composing.
    clash = (dict,) if kinds & {list, tuple} else (list,) if dict in kinds else ()
    return [v for v in candidates if _rejected(tp, meta, v) and not isinstance(v, clash)]


def _override(value: Any) -> str:
    """A value as Hydra override text (a plain string is quoted so it stays a string)."""
    if isinstance(value, str):
        return f"'{value}'"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else "inf"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_override(v) for v in value) + "]"
    return repr(value)


TYPED = {preset: load_config(compose_config("logger=none", *preset)) for preset in PRESETS}


def _cases() -> list[tuple[tuple[str, ...], str, Any]]:
    seen, out = set(), []
    for preset, typed in TYPED.items():
        for key, tp, meta in _fields(typed):
            if key in seen or key == "run_dir":  # run_dir is where the test looks for work
                continue
            seen.add(key)
            out += [(preset, key, v) for v in _invalid(tp, meta)]
    return out


CASES = _cases()


def _must_stop(overrides: tuple[str, ...], key: str) -> None:
    """Compose like `resfl train`, call its entry, expect ConfigError naming `key` before anything is built."""
    def no_work(*args, **kwargs):
        raise AssertionError(f"work started for {overrides}: the config error for {key} was not caught up front")

    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as tmp:
        patch.setattr(builders.L, "Fabric", no_work)
        patch.setattr("resfl_lightning.data.federated.build_federated_data", no_work)
        run_dir = Path(tmp) / "run"
        cfg = compose_config("logger=csv", f"run_dir={run_dir}", *overrides)
        with pytest.raises(ConfigError) as err:
            builders.build_run(cfg)
        message = str(err.value)
        assert message.startswith(f"{key}:") or message.startswith(f"{key}."), (overrides, message)
        assert not run_dir.exists(), f"{overrides} created {run_dir}"


def test_the_schema_has_cases_for_every_section():
    keys = {key for _, key, _ in CASES}
    for section in ("seed", "federation.rounds", "optim.lr", "ufm.gate", "eval.every", "export.weights",
                    "debug.kill_round", "fabric.num_nodes", "logger.kind", "model.scale", "dataset.num_clients",
                    "dataset.loader.num_workers", "dataset.recipe.lr", "dataset.imbalance", "dataset.sensitive",
                    "dataset.towns", "dataset.classes", "dataset.quality_skew.dim", "algorithm.beta",
                    "algorithm.dp.target_delta", "algorithm.logit_privacy.clip",
                    "algorithm.post_calibration.smoothing"):
        assert section in keys, section


@EXAMPLES
@given(case=st.sampled_from(CASES))
def test_invalid_values_stop_the_run_before_any_work(case):
    preset, key, value = case
    _must_stop((*preset, f"++{key}={_override(value)}"), key)  # ++: also keys only the schema declares


@EXAMPLES
@given(section=st.sampled_from(["", "federation.", "optim.", "ufm.", "eval.", "debug.", "fabric.", "logger.",
                                "model.", "dataset.", "dataset.loader.", "dataset.recipe.", "algorithm."]),
       name=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12))
def test_unknown_keys_stop_the_run(section, name):
    key = f"{section}{name}"
    if OmegaConf.select(TYPED[()], key) is not None or key in OPAQUE:
        return  # a real key
    _must_stop((f"+{key}=1",), key)


def _combo(draw) -> tuple[tuple[str, ...], str]:
    """(overrides, the key the error must name) of one invalid combination."""
    n = draw(st.integers(1, 4))
    k = draw(st.integers(1, n))
    high = draw(st.floats(0.1, 5))
    step = draw(st.floats(0.01, 5))
    combos = [
        ((f"dataset.num_clients={n}", f"fabric.devices={n + draw(st.integers(1, 4))}"), "fabric.devices"),
        ((f"dataset.num_clients={n}", f"fabric.num_nodes={n + 1}"), "fabric.devices"),  # devices x nodes > clients
        ((f"ufm.clip_high={high}", f"ufm.clip_low={high + step}"), "ufm.clip_low"),
        ((f"dataset.num_clients={n}", f"federation.clients_per_round={k}",
          f"federation.min_clients={k + draw(st.integers(1, 3))}"), "federation.min_clients"),
        (("algorithm=fedavg_dp", f"algorithm.sam_rho={step}"), "algorithm.sam_rho"),  # DP-SGD has no SAM pass
        (("algorithm=puffle", f"algorithm.lambda_curv={step}"), "algorithm.lambda_curv"),
        (("algorithm=fedavg_dp", draw(st.sampled_from(["fabric=gpu", "fabric.precision=16-mixed"]))),
         "fabric.precision"),
        (("algorithm=fedavg_dp", draw(st.sampled_from(["algorithm.dp.noise_multiplier=1.0",
                                                       "algorithm.dp.target_epsilon=null"]))), "algorithm.dp"),
        (("ufm.gate_mode=relative", "ufm.gate=null"), "ufm.gate"),  # a relative gate ignores ufm.gate
        (("algorithm.swa_lr_high=1.0",), "algorithm.swa_lr_low"),  # the SWA lr cycle needs both ends
        ((f"algorithm.swa_lr_high={high}", f"algorithm.swa_lr_low={high + step}"), "algorithm.swa_lr_low"),
        (("dataset.loader.persistent_workers=true",), "dataset.loader.persistent_workers"),  # need workers
        (("dataset.loader.prefetch_factor=2",), "dataset.loader.prefetch_factor"),
        ((f"dataset.num_clients={n}", f"debug.fail_clients=['{n + draw(st.integers(0, 3))}:0:raise']"),
         "debug.fail_clients"),  # a fault for a client that does not exist
        (("debug.fail_clients=['0:x:raise']",), "debug.fail_clients"),
        ((*ADULT, "ufm.cohorts=proxy"), "ufm.cohorts"),  # label-free proxy cohorts, weather, quality skew: images
        ((*ADULT, "eval.weather=true"), "eval.weather"),
        ((*ADULT, "scenario=quality_skew"), "dataset.quality_skew"),
        ((*ADULT, f"dataset.test_fraction={draw(st.floats(0.01, 0.9))}"), "dataset.test_fraction"),
        ((*ADULT, "dataset.drop_sensitive=true"), "dataset.num_features"),
        (("dataset=carla", "dataset.reserve_splits=[finetune]"), "dataset.reserve_splits"),
        (("export.weights=swa",), "export.weights"),  # no SWA average to export
        ((f"algorithm.swa_start={draw(st.floats(1.01, 50))}",), "algorithm.swa_start"),
    ]
    return draw(st.sampled_from(combos))


@EXAMPLES
@given(data=st.data())
def test_invalid_combinations_stop_the_run_before_any_work(data):
    overrides, key = _combo(data.draw)
    _must_stop(overrides, key)


@pytest.mark.parametrize(("overrides", "key"), [
    (("attack=privacy", "attack.mia.calibration=zzz"), "attack.mia.calibration"),
    (("attack=privacy", "+attack.mia.colour=1"), "attack.mia.colour"),
])
def test_the_attack_node_is_checked_before_any_work(overrides, key):
    """The attack group is its registry's schema (resfl_lightning/attacks/registry.py); build_run reads it up front."""
    _must_stop(overrides, key)


@pytest.mark.parametrize("preset", [f"algorithm={p.stem}" for p in sorted((CONF / "algorithm").glob("*.yaml"))]
                         + [f"dataset={p.stem}" for p in sorted((CONF / "dataset").glob("*.yaml"))]
                         + [f"scenario={p.stem}" for p in sorted((CONF / "scenario").glob("*.yaml"))])
def test_every_preset_passes_the_schema(preset):
    extra = ("dataset.root=/d",) if preset == "dataset=adult" else ()
    typed = load_config(compose_config("logger=none", preset, *extra))
    assert isinstance(OmegaConf.to_object(typed.dataset), FederatedDataset)
    assert load_config(typed) is typed  # a loaded config passes through


def test_every_key_has_a_doc():
    def sections(cls, seen):
        if cls in seen:
            return
        seen.add(cls)
        yield cls
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            for arm in typing.get_args(hints[f.name]) or (hints[f.name],):
                if isinstance(arm, type) and issubclass(arm, Section):
                    yield from sections(arm, seen)

    seen: set = set()
    roots = [RunConfig] + [OmegaConf.get_type(typed[node]) for typed in TYPED.values()
                           for node in ("dataset", "algorithm")]
    missing = [f"{cls.__name__}.{f.name}" for root in roots for cls in sections(root, seen)
               for f in dataclasses.fields(cls) if not f.metadata.get("doc")]
    assert not missing


# --- the dataset registry: a dataset is a class its config names -----------------------------------------------


@dataclass(kw_only=True)
class RowsDataset(FederatedDataset):
    """A tiny tabular dataset known only to this test module."""

    task: str = setting("classification", "what the clients learn", choices=("classification",))
    rows: int = setting(80, "training rows", ge=8)

    def build(self, seed: int):
        rng = np.random.default_rng(seed)
        x, y, s = rng.normal(size=(self.rows + 20, 3)).astype(np.float32), rng.integers(0, 2, self.rows + 20), \
            rng.integers(0, 2, self.rows + 20)
        return federated_tabular_data(x[:self.rows], y[:self.rows], s[:self.rows], x[self.rows:], y[self.rows:],
                                      s[self.rows:], num_groups=2, seed=seed, num_clients=self.num_clients,
                                      reserve_fraction=self.reserve_fraction, val_fraction=self.val_fraction,
                                      batch_size=self.batch_size)


def rows_node(**extra):
    return OmegaConf.create({"_target_": f"{__name__}.RowsDataset", "name": "rows", "gate_mode": "absolute",
                             "num_clients": 2, "test_fraction": 0.0,
                             "recipe": {"rounds": 2, "local_epochs": 1, "lr": 0.01}, **extra})


def test_a_dataset_class_is_instantiated_from_its_target():
    lines: list[str] = []
    data = build_federated_data(rows_node(rows=60), seed=3, printer=lines.append)
    assert data.num_clients == 2 and data.x.shape == (80, 3) and lines[0].startswith("dataset rows:")
    with pytest.raises(ConfigError, match=r"^dataset\.rows: must be >= 8, got 2"):
        build_federated_data(rows_node(rows=2), seed=3)
    with pytest.raises(ConfigError, match=r"^dataset\.colour: unknown key; RowsDataset has"):
        build_federated_data(rows_node(colour="red"), seed=3)
    with pytest.raises(ConfigError, match=r"^dataset\._target_: .* is not a .*FederatedDataset"):
        build_federated_data(rows_node(_target_="tests.helpers.compose_config"), seed=3)
    node = rows_node()
    del node["name"]
    with pytest.raises(ConfigError, match=r"^dataset\.name: missing"):
        build_federated_data(node, seed=3)
