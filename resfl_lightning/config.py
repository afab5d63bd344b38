"""Validation of the composed Hydra config before any work starts: every error names the offending key."""

from __future__ import annotations

import math
import numbers

from omegaconf import DictConfig, OmegaConf

DATASETS = ("synthetic", "facet", "carla", "adult")
AGGREGATIONS = ("resfl", "ufm_softmax", "fedavg", "uniform", "curvfed", "fairfed")


class ConfigError(ValueError):
    """A bad config value, reported with its key before anything is built."""


def _require(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {message}")


# Numeric keys: (int or float, nullable). Checked before any comparison, so a string, a list or NaN given for one of
# them is reported with its key instead of surfacing as a TypeError later (tests/test_fuzz_config.py).
NUMERIC_KEYS: dict[str, tuple[type, bool]] = {
    **{f"algorithm.{k}": (float, False) for k in ("beta", "lambda_priv", "lambda_fair", "lambda_curv", "grl_scale",
                                                 "adversary_lr", "sam_rho", "lambda_task", "curv_eps")},
    **{f"algorithm.{k}": (int, False) for k in ("adversary_steps", "anneal_rounds", "curv_iters", "fim_iters")},
    **{f"ufm.{k}": (float, False) for k in ("clip_low", "clip_high", "score_threshold", "iou_threshold", "eps",
                                           "evidence_floor", "drop_fraction", "flip_rate")},
    "ufm.ema_decay": (float, True), "ufm.gate": (float, True), "ufm.insufficient_groups_u": (float, True),
    "ufm.min_group_persons": (int, False), "ufm.num_cohorts": (int, False),
    **{f"dataset.{k}": (int, False) for k in ("num_clients", "batch_size", "extra_reserve_images")},
    **{f"dataset.loader.{k}": (int, False) for k in ("num_workers",)},
    "dataset.loader.prefetch_factor": (int, True),
    "fabric.num_nodes": (int, False), "fabric.timeout_s": (float, False),
    **{f"federation.{k}": (int, False) for k in ("rounds", "local_epochs", "min_clients")},
    "federation.server_lr": (float, False), "federation.lr_gamma": (float, False),
    "eval.every": (int, False), "optim.lr": (float, False), "optim.momentum": (float, False),
    "optim.weight_decay": (float, False), "optim.grad_clip": (float, True),
    "debug.kill_rank": (int, True), "debug.kill_round": (int, False), "seed": (int, False),
    "federation.max_skipped_rounds": (int, True),
}


# Ranges the settings dataclasses enforce (checked here so the error comes before any work, with the key):
# key -> (low, high, low inclusive, high inclusive); None = unbounded.
RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    "federation.lr_gamma": (0, 1, False, True),
    **{f"ufm.{k}": (0, 1, True, True) for k in ("score_threshold", "iou_threshold", "drop_fraction", "flip_rate")},
    "ufm.eps": (0, None, False, True), "ufm.evidence_floor": (0, None, False, True),
    "ufm.num_cohorts": (2, None, True, True),
    **{f"algorithm.{k}": (1, None, True, True) for k in ("anneal_rounds", "curv_iters", "fim_iters")},
    "algorithm.curv_eps": (0, None, False, True),
    "optim.momentum": (0, None, True, True), "optim.weight_decay": (0, None, True, True),
    "optim.grad_clip": (0, None, False, True), "fabric.num_nodes": (1, None, True, True),
    "debug.kill_round": (0, None, True, True), "debug.kill_rank": (0, None, True, True), "seed": (0, None, True, True),
    "federation.max_skipped_rounds": (0, None, True, True),
}


def _in_range(key: str, v: float) -> None:
    if key not in RANGES:
        return
    lo, hi, lo_in, hi_in = RANGES[key]
    ok = (lo is None or (v >= lo if lo_in else v > lo)) and (hi is None or (v <= hi if hi_in else v < hi))
    low, high = "-inf" if lo is None else lo, "inf" if hi is None else hi
    text = f"{'[' if lo_in else '('}{low}, {high}{']' if hi_in else ')'}"
    _require(ok, key, f"must lie in {text}, got {v!r}")


def _check_types(cfg: DictConfig) -> None:
    for key, (kind, nullable) in NUMERIC_KEYS.items():
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        if not isinstance(parent, DictConfig) or leaf not in parent:
            continue  # optional key absent: its default applies
        v = parent[leaf]
        if v is None:
            _require(nullable, key, "must be set (null is not allowed)")
            continue
        is_num = isinstance(v, numbers.Real) and not isinstance(v, bool)
        if kind is int:
            _require(is_num and float(v).is_integer(), key, f"must be an integer, got {v!r}")
        else:
            _require(is_num and math.isfinite(float(v)), key, f"must be a finite number, got {v!r}")
        _in_range(key, float(v))


def validate_config(cfg: DictConfig) -> None:
    ds, algo, fab, ufm, fed = cfg.dataset, cfg.algorithm, cfg.fabric, cfg.ufm, cfg.federation
    _check_types(cfg)
    _require(ds.name in DATASETS, "dataset.name", f"unknown dataset {ds.name!r}; choose one of {', '.join(DATASETS)}")
    _require(algo.aggregation in AGGREGATIONS, "algorithm.aggregation",
             f"unknown aggregation {algo.aggregation!r}; choose one of {', '.join(AGGREGATIONS)}")
    for key in ("beta", "lambda_priv", "lambda_fair", "lambda_curv", "grl_scale"):
        _require(float(algo[key]) >= 0, f"algorithm.{key}", f"must be >= 0, got {algo[key]}")
    _require(float(ufm.clip_low) <= float(ufm.clip_high), "ufm.clip_low/ufm.clip_high",
             f"clip bounds inverted: [{ufm.clip_low}, {ufm.clip_high}]")
    _require(ufm.ema_decay is None or 0 <= float(ufm.ema_decay) < 1, "ufm.ema_decay",
             f"must be null or in [0, 1), got {ufm.ema_decay}")
    _require(ufm.gate is None or 0 <= float(ufm.gate) <= 1, "ufm.gate", f"must be null or in [0, 1], got {ufm.gate}")
    # A config error must stop the run up front: raised inside a client it would look like a client failure.
    _require(not (ds.get("task") == "classification" and ufm.get("cohorts") == "proxy"), "ufm.cohorts",
             "'proxy' needs a proxy column, which tabular data does not provide; use groups, cluster or slices")
    _require(int(ufm.get("min_group_persons", 1)) >= 1, "ufm.min_group_persons",
             f"must be >= 1, got {ufm.get('min_group_persons')}")
    _require(float(algo.get("adversary_lr", 1e-3)) > 0, "algorithm.adversary_lr",
             f"must be > 0, got {algo.get('adversary_lr')}")
    _require(algo.get("adversary_optimizer", "adam") in ("adam", "sgd"), "algorithm.adversary_optimizer",
             f"must be adam or sgd, got {algo.get('adversary_optimizer')!r}")
    _require(int(algo.get("adversary_steps", 1)) >= 1, "algorithm.adversary_steps",
             f"must be >= 1, got {algo.get('adversary_steps')}")
    _require(float(algo.get("sam_rho", 0.0)) >= 0, "algorithm.sam_rho", f"must be >= 0, got {algo.get('sam_rho')}")
    _require(float(algo.get("lambda_task", 1.0)) >= 0, "algorithm.lambda_task",
             f"must be >= 0, got {algo.get('lambda_task')}")
    _require(int(ds.num_clients) >= 1, "dataset.num_clients", f"must be >= 1, got {ds.num_clients}")
    devices = int(fab.devices) if str(fab.devices).lstrip("-").isdigit() else None
    _require(devices is None or devices >= 1, "fabric.devices", f"must be >= 1, got {fab.devices}")
    if devices is not None:
        world = devices * int(fab.num_nodes)
        _require(world <= int(ds.num_clients), "fabric.devices",
                 f"{world} processes (devices x num_nodes) but only {ds.num_clients} clients; "
                 "every process must own at least one client")
    _require(int(fed.rounds) >= 1, "federation.rounds", f"must be >= 1, got {fed.rounds}")
    _require(int(fed.local_epochs) >= 1, "federation.local_epochs", f"must be >= 1, got {fed.local_epochs}")
    _require(float(fed.server_lr) > 0, "federation.server_lr", f"must be > 0, got {fed.server_lr}")
    _require(int(cfg.eval.every) >= 1, "eval.every", f"must be >= 1, got {cfg.eval.every}")
    _require(float(cfg.optim.lr) > 0, "optim.lr", f"must be > 0, got {cfg.optim.lr}")
    _require(int(ds.batch_size) >= 1, "dataset.batch_size", f"must be >= 1, got {ds.batch_size}")
    _require(int(ds.get("extra_reserve_images", 0)) >= 0, "dataset.extra_reserve_images",
             f"must be >= 0, got {ds.get('extra_reserve_images')}")
    if algo.aggregation == "curvfed":
        _require(bool(algo.report_fim), "algorithm.report_fim", "curvfed aggregation needs report_fim=true")
    _validate_scale_and_faults(cfg)


def _validate_scale_and_faults(cfg: DictConfig) -> None:
    """Participation, quorum, collective timeout, loader and fault-injection keys (issue 11)."""
    from resfl_lightning.federation.faults import FaultPlan
    from resfl_lightning.federation.participation import sample_size

    fed, n = cfg.federation, int(cfg.dataset.num_clients)
    try:
        k = sample_size(fed.get("clients_per_round"), n)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    min_clients = int(fed.get("min_clients", 1))
    _require(1 <= min_clients <= k, "federation.min_clients",
             f"must lie in 1..{k} (the clients sampled per round), got {min_clients}")
    _require(float(cfg.fabric.get("timeout_s", 1800)) > 0, "fabric.timeout_s",
             f"must be > 0 seconds, got {cfg.fabric.get('timeout_s')}")
    loader = cfg.dataset.get("loader") or {}
    workers = int(loader.get("num_workers", 0))
    _require(workers >= 0, "dataset.loader.num_workers", f"must be >= 0, got {workers}")
    for flag in ("pin_memory", "persistent_workers"):
        _require(isinstance(loader.get(flag, False), bool), f"dataset.loader.{flag}",
                 f"must be true or false, got {loader.get(flag)!r}")
    _require(not loader.get("persistent_workers", False) or workers > 0, "dataset.loader.persistent_workers",
             "needs dataset.loader.num_workers > 0")
    prefetch = loader.get("prefetch_factor")
    _require(prefetch is None or (workers > 0 and int(prefetch) >= 1), "dataset.loader.prefetch_factor",
             f"must be null, or >= 1 with num_workers > 0; got {prefetch}")
    debug = cfg.get("debug") or {}
    specs = debug.get("fail_clients") or []
    _require(OmegaConf.is_list(specs) or isinstance(specs, (list, tuple)), "debug.fail_clients",
             f"must be a list of '<client>:<round or *>:<fault>' entries, got {specs!r}")
    try:
        plan = FaultPlan.parse(specs)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    for client_id, _ in plan.entries:
        _require(client_id < n, "debug.fail_clients", f"client {client_id} does not exist ({n} clients)")
