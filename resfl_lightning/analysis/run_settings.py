"""Does a finished run match the command that would train it now? `make table` skips finished runs, so a run trained
with other settings (an older table preset, other ARGS) would silently enter a new table without this check.

The reference is the resolved config the run saved (RUN/config.yaml, written by callbacks/run_files.py), compared
with the config the same overrides compose to now.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from resfl_lightning.analysis.run_records import is_finished
from resfl_lightning.resources import conf_dir
from resfl_lightning.run_config.tuned import SWITCH

# Overrides that vary between the runs of one grid cell and reach the config only as their own value (and through
# interpolations such as run_name): a cell's config is composed once and these are set on a copy of it.
VARYING = ("seed", "run_dir")


def _split_varying(overrides: list[str]) -> tuple[tuple[str, ...], tuple[tuple[str, object], ...]]:
    """(the overrides that select settings, ((key, parsed value), ...) of the VARYING ones)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    fixed, varying = [], []
    for o in overrides:
        key = o.split("=", 1)[0]
        if key in VARYING and "=" in o:
            varying.append((key, OverridesParser.create().parse_overrides([o])[0].value()))
        else:
            fixed.append(o)
    return tuple(fixed), tuple(varying)


@functools.lru_cache(maxsize=1024)
def _composed_cell(conf: str, fixed: tuple[str, ...]):
    """The unresolved config `resfl train <fixed>` runs with from the config folder `conf` (its tuned file applied);
    cached because composing takes ~0.3 s and a grid's seeds share it. One command composes from files that do not
    change while it runs; clear_composed() forgets them (tests that edit conf/)."""
    from hydra import compose, initialize_config_dir

    from resfl_lightning.run_config.tuned import recompose

    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(fixed), return_hydra_config=True)
        choices = dict(cfg.hydra.runtime.choices)
        again = recompose(list(fixed), choices, lambda o: compose(config_name="train", overrides=o))
        return again if again is not None else compose(config_name="train", overrides=list(fixed))


def clear_composed() -> None:
    _composed_cell.cache_clear()


def composed_config(overrides: list[str]):
    """The config `resfl train <overrides>` would run with (its tuned file applied), unresolved: a fresh copy."""
    fixed, varying = _split_varying(list(overrides))
    cfg = copy.deepcopy(_composed_cell(str(conf_dir()), fixed))
    for key, value in varying:
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def composed_settings(overrides: list[str]) -> dict[str, Any]:
    """The resolved config `resfl train <overrides>` would run with (its tuned file applied), as plain containers."""
    return OmegaConf.to_container(composed_config(overrides), resolve=True)


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a.b.c": leaf} for nested dicts; lists are leaves."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


ABSENT = "<absent>"  # a key only one side has


def settings_diff(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """'key: saved -> now' for every leaf that differs, is missing on one side or was added."""
    a, b = flatten(saved), flatten(now)
    pairs = {k: (a[k] if k in a else ABSENT, b[k] if k in b else ABSENT) for k in sorted(a.keys() | b.keys())}
    return [f"{k}: {was} -> {new}" for k, (was, new) in pairs.items() if was != new]


# Where a run lives is no setting of it: a table folder may be moved and resumed from its new place. Nor is whether
# it continued from its own checkpoint (the launcher resumes an interrupted run: analysis/run_resume.py).
LOCATION_KEYS = ("run_dir", "resume")
# Nor is whether its batches were pinned (how fast they reach a GPU, never their values): runs saved with the old
# default (false) match the current one (auto, which is false on a CPU).
TRANSFER_KEYS = ("dataset.loader.pin_memory",)
# Nor the switch that applies a tuned file: what it changes is in the config itself (tuned_file and the keys the file
# sets), so a run trained at the preset with no tuned file to apply is the run use_tuned=false composes now.
SWITCH_KEYS = (SWITCH,)
# Nor the record of which tuned file supplied values (tuned_file): the values are compared key by key, and a pin that
# sets every key of a file (conf/table/robustness.yaml `pinned:`) leaves nothing of it applied, so the record goes
# null while the run is the same run.
RECORD_KEYS = ("tuned_file",)
# Nor how phi pools a detection box on a run that has no boxes: every method's config carries the adversary preset's
# keys, but only the detection client reads these, so a tabular run saved with the earlier default (roi_align, before
# 2026-11-29) is the run composed now, bit for bit.
DETECTION_ONLY_KEYS = (
    "algorithm.adversary_roi_impl", "algorithm.adversary_roi_bins", "algorithm.adversary_roi_samples")
# Nor where a class lives: the attack classes moved from callbacks/ to attacks/ (docs/renamed.md), so a run saved
# with the old `_target_` is the run the new one composes now.
MOVED_TARGETS = {
    **{f"resfl_lightning.callbacks.privacy.{name}": f"resfl_lightning.attacks.privacy_attacks.{name}"
       for name in ("MembershipInference", "AttributeInference")},
    **{f"resfl_lightning.callbacks.robustness.{name}": f"resfl_lightning.attacks.robustness_attacks.{name}"
       for name in ("ByzantineAttack", "DataPoisoning", "EqualizedOdds")},
    "resfl_lightning.callbacks.update_aia.UpdateAttributeInference":
        "resfl_lightning.attacks.update_aia_attack.UpdateAttributeInference",
}


# Nor a key added after the run was saved, where the run behaved as the key's legacy value: a saved config without the
# key matches a composed one only when the composed value is that legacy value (a run composed with another value is
# another run). The synthetic benchmark's generator knobs exposed for the calibrated preset (docs/benchmark.md); the
# group metrics' minimum group size and the CSV loader's merge of rare groups (issue 58: every group was kept); the
# MIA's method, its reference-model knobs, the per-client audit and the audit beside the shadow attack (issue 56: every
# earlier run used the shadow attack alone, which reads none); the calibrated Byzantine attacks' line-search budget and
# the adaptive kinds' margins (issue 57: no earlier kind reads them); the defence fidelity options (issue 57 item 5:
# FLTrust's root steps, centered clipping's worker momentum, FLAME's noise lambda), whose legacy values are the rules as
# they ran before; the curvature term's refresh (issue 54: every earlier run computed it every step); resfl_robust's
# bound on a reported SE (issue 57: every earlier checked run used the SE as reported).
ADDED_KEYS: dict[str, Any] = {
    "dataset.dim_correlation": None, "dataset.background_correlation": None, "dataset.min_persons": 1,
    "dataset.max_persons": 4, "dataset.min_person_height": 0.15, "dataset.max_person_height": 0.6,
    "dataset.short_sleeve_probability": 0.5, "dataset.shorts_probability": 0.25,
    "dataset.dark_clothing_probability": None, "dataset.sleeveless_probability": None,
    "metrics.min_group_size": 1, "dataset.merge_groups_below": 0,
    "attack.mia.method": "shadow", "attack.mia.references": 4, "attack.mia.rmia_gamma": 1.0,
    "attack.mia.rmia_offline_a": 1.0, "attack.mia.per_client": False, "attack.mia.audit": None,
    "attack.byzantine.search_evals": 16,
    "attack.byzantine.trust_margin": 0.1, "attack.byzantine.report_margin": 0.5, "algorithm.curv_refresh": 1,
    "algorithm.curv_direction": "converged",
    "aggregation.root_steps": "root_split", "aggregation.worker_momentum": 0.0, "aggregation.noise_lambda": 0.0,
    "aggregation.check_se": "reported",
}


def with_legacy_values(saved: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The flat saved settings with each ADDED_KEYS key it lacks (and `now` has) set to its legacy value."""
    missing = {k: v for k, v in ADDED_KEYS.items() if k not in saved and k in now}
    return {**saved, **missing}


def legacy_aware_diff(earlier: dict[str, Any], later: dict[str, Any], both_ways: bool = False) -> list[str]:
    """settings_diff of two configs (nested or flat) where a key `earlier` lacks counts as its legacy value
    (ADDED_KEYS); with both_ways also the keys `later` lacks (two saved runs: either may predate the key)."""
    earlier, later = flatten(earlier), flatten(later)
    filled = with_legacy_values(earlier, later)
    return settings_diff(filled, with_legacy_values(later, earlier) if both_ways else later)


def current_targets(tree: Any) -> Any:
    """The saved config with every moved `_target_` (MOVED_TARGETS) replaced by where its class lives now."""
    if isinstance(tree, dict):
        return {k: MOVED_TARGETS.get(v, v) if k == "_target_" and isinstance(v, str) else current_targets(v)
                for k, v in tree.items()}
    return tree


def finished_run_mismatch(run_dir: Path, overrides: list[str]) -> list[str]:
    """The settings in which RUN/config.yaml differs from what `overrides` compose to now ([] when none, or when the
    run saved no config to compare with)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return []
    return saved_config_mismatch(path.read_text(), overrides)


def saved_config_mismatch(saved_yaml: str, overrides: list[str]) -> list[str]:
    """The settings in which a run's saved config (its config.yaml text) differs from what `overrides` compose to
    now, where it lives and how its batches were pinned aside ([] when none)."""
    saved = current_targets(OmegaConf.to_container(OmegaConf.create(saved_yaml), resolve=True))
    now = composed_settings(overrides)
    saved, now = ({k: v for k, v in d.items() if k not in LOCATION_KEYS} for d in (saved, now))
    ignored = (*TRANSFER_KEYS, *SWITCH_KEYS, *RECORD_KEYS,
               *(() if "detection" in (task_of(saved), task_of(now)) else DETECTION_ONLY_KEYS))
    return [line for line in legacy_aware_diff(saved, now) if line.split(":", 1)[0] not in ignored]


def task_of(config: dict[str, Any]) -> str | None:
    """The run's task (dataset.task: detection, classification), None where the config names none."""
    dataset = config.get("dataset")
    return dataset.get("task") if isinstance(dataset, dict) else None


def stale_runs(jobs: list[tuple[Path, list[str]]]) -> list[str]:
    """One line per finished run of `jobs` ((run_dir, overrides); a resumable command skips it) whose saved config
    differs from what its overrides compose to now, naming the run and its first differing settings."""
    stale = []
    for run_dir, overrides in jobs:
        diff = finished_run_mismatch(run_dir, overrides) if is_finished(run_dir) else []
        if diff:
            more = f" (and {len(diff) - 4} more)" if len(diff) > 4 else ""
            stale.append(f"{run_dir}: " + "; ".join(diff[:4]) + more)
    return stale
