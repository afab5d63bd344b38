"""Config -> baseline plug-ins on a freshly built client (before any gradient exists), and their config checks."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from resfl_lightning.baselines.privfairfl import (
    CalibrationStatistics,
    LogitPrivacySettings,
    PerturbCalibrate,
    PostCalibrationSettings,
)
from resfl_lightning.config import ConfigError
from resfl_lightning.privacy.dp import ClientDP, DPSettings, prepare_model


def _section(cfg: DictConfig, key: str) -> dict | None:
    node = cfg.algorithm.get(key)
    return None if node is None else OmegaConf.to_container(node, resolve=True)


def _build(cls, cfg: DictConfig, key: str, **extra):
    values = _section(cfg, key)
    if values is None:
        return None
    if "temperatures" in values:
        values["temperatures"] = tuple(float(t) for t in values["temperatures"])
    try:
        return cls(**values, **extra)
    except TypeError as err:  # an unknown key in the section
        raise ConfigError(f"algorithm.{key}: {err}") from err
    except ValueError as err:
        raise ConfigError(str(err)) from err


def dp_settings(cfg: DictConfig) -> DPSettings | None:
    """`algorithm.dp` (absent: no DP), planned over federation.rounds x federation.local_epochs."""
    return _build(DPSettings, cfg, "dp", rounds=int(cfg.federation.rounds),
                  local_epochs=int(cfg.federation.local_epochs))


def logit_privacy_settings(cfg: DictConfig) -> LogitPrivacySettings | None:
    return _build(LogitPrivacySettings, cfg, "logit_privacy")


def post_calibration_settings(cfg: DictConfig) -> PostCalibrationSettings | None:
    return _build(PostCalibrationSettings, cfg, "post_calibration")


def validate_baselines(cfg: DictConfig) -> None:
    """Fail before any process starts on combinations DP-SGD cannot honour."""
    a = cfg.algorithm
    if float(a.get("w_fair", 0.0)) < 0:
        raise ConfigError(f"algorithm.w_fair: must be >= 0, got {a.w_fair}")
    logit_privacy_settings(cfg)
    post_calibration_settings(cfg)
    if dp_settings(cfg) is None:
        return
    if float(a.get("sam_rho", 0.0)) > 0:
        raise ConfigError("algorithm.sam_rho: SAM's second gradient pass is not part of DP-SGD; set 0 with "
                          "algorithm.dp")
    if float(a.lambda_curv) > 0:
        raise ConfigError("algorithm.lambda_curv: the curvature term's extra backward passes would be taken as "
                          "per-sample gradients; set 0 with algorithm.dp")
    if "16-mixed" in str(cfg.fabric.precision) and not str(cfg.fabric.precision).startswith("bf16"):
        raise ConfigError(f"fabric.precision={cfg.fabric.precision}: the AMP loss scale would enter the per-sample "
                          "clipping; use 32-true or bf16-mixed with algorithm.dp")


def attach_baselines(client, cfg: DictConfig):
    """Make `client` DP-ready (GroupNorm model, opacus hooks, accountant) and attach PrivFairFL's hooks."""
    dp = dp_settings(cfg)
    if dp is not None:
        client.model = prepare_model(client.model)
        if hasattr(client, "criterion"):  # the detection loss reads the (new) model's head geometry
            client.criterion = type(client.criterion)(client.model)
        client.dp = ClientDP(dp, client.model)
    pre = logit_privacy_settings(cfg)
    if pre is not None:
        client.upload_transform = PerturbCalibrate(pre)
    post = post_calibration_settings(cfg)
    if post is not None:
        client.report_statistics = CalibrationStatistics(post)
    return client
