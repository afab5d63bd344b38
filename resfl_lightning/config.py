"""Validation of the composed Hydra config before any work starts: every error names the offending key."""

from __future__ import annotations

from omegaconf import DictConfig

DATASETS = ("synthetic", "facet", "carla", "adult")
AGGREGATIONS = ("resfl", "ufm_softmax", "fedavg", "uniform", "curvfed")


class ConfigError(ValueError):
    """A bad config value, reported with its key before anything is built."""


def _require(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{key}: {message}")


def validate_config(cfg: DictConfig) -> None:
    ds, algo, fab, ufm, fed = cfg.dataset, cfg.algorithm, cfg.fabric, cfg.ufm, cfg.federation
    _require(ds.name in DATASETS, "dataset.name", f"unknown dataset {ds.name!r}; choose one of {', '.join(DATASETS)}")
    _require(algo.aggregation in AGGREGATIONS, "algorithm.aggregation",
             f"unknown aggregation {algo.aggregation!r}; choose one of {', '.join(AGGREGATIONS)}")
    for key in ("beta", "lambda_priv", "lambda_fair", "lambda_curv", "grl_scale"):
        _require(float(algo[key]) >= 0, f"algorithm.{key}", f"must be >= 0, got {algo[key]}")
    _require(float(ufm.clip_low) <= float(ufm.clip_high), "ufm.clip_low/ufm.clip_high",
             f"clip bounds inverted: [{ufm.clip_low}, {ufm.clip_high}]")
    _require(ufm.ema_decay is None or 0 <= float(ufm.ema_decay) < 1, "ufm.ema_decay",
             f"must be null or in [0, 1), got {ufm.ema_decay}")
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
