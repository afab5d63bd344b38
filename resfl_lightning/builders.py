"""Turn a validated config into Fabric, logger, data, client factory, aggregator and callbacks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import lightning as L
from omegaconf import DictConfig, OmegaConf

from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.config import ConfigError, validate_config
from resfl_lightning.federation.aggregation import build_aggregator
from resfl_lightning.federation.checkpoint import read_logger_run_id
from resfl_lightning.federation.orchestrator import Federation, FederationSettings


def loss_weights(cfg: DictConfig) -> LossWeights:
    a = cfg.algorithm
    return LossWeights(lambda_priv=a.lambda_priv, lambda_fair=a.lambda_fair, lambda_curv=a.lambda_curv,
                       grl_scale=a.grl_scale, anneal_rounds=a.anneal_rounds, curv_iters=a.curv_iters,
                       curv_params=a.curv_params)


def ufm_settings(cfg: DictConfig) -> UfmSettings:
    return UfmSettings(**OmegaConf.to_container(cfg.ufm, resolve=True))


def optim_settings(cfg: DictConfig) -> OptimSettings:
    return OptimSettings(**OmegaConf.to_container(cfg.optim, resolve=True))


def federation_settings(cfg: DictConfig) -> FederationSettings:
    f, a = cfg.federation, cfg.algorithm
    return FederationSettings(
        rounds=f.rounds, local_epochs=f.local_epochs, server_lr=f.server_lr,
        lr_milestones=tuple(f.lr_milestones), lr_gamma=f.lr_gamma, seed=cfg.seed, resume=cfg.resume,
        run_dir=Path(cfg.run_dir), report_fim=a.report_fim, fim_iters=a.fim_iters,
        crash_after_round=cfg.debug.crash_after_round, swa_start=a.get("swa_start"), swa_every=a.get("swa_every", 1),
    )


def build_client(cfg: DictConfig, data):
    """A fresh client module (detection or tabular) for the configured dataset and model."""
    num_groups, num_classes = data.num_groups, data.num_classes
    if cfg.dataset.task == "detection":
        from resfl_lightning.clients.detection import DetectionClient
        from resfl_lightning.models.yolo import YoloSpec

        spec = YoloSpec(num_classes=num_classes, scale=cfg.model.scale, yaml=cfg.model.yaml,
                        image_size=cfg.dataset.image_size)
        return DetectionClient(spec, num_groups, loss_weights(cfg), ufm_settings(cfg), optim_settings(cfg),
                               adversary_hidden=cfg.algorithm.adversary_hidden)
    from resfl_lightning.clients.tabular import TabularClient

    return TabularClient(data.num_features, num_groups, loss_weights(cfg), ufm_settings(cfg), optim_settings(cfg),
                         hidden=tuple(cfg.model.hidden), num_classes=num_classes,
                         adversary_hidden=cfg.algorithm.adversary_hidden)


def build_logger(cfg: DictConfig, run_dir: Path):
    kind = cfg.logger.kind
    if kind == "none":
        return None
    if kind == "csv":
        from lightning.fabric.loggers import CSVLogger

        return CSVLogger(root_dir=str(run_dir), name="csv", version=0)
    if kind == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        run_id = read_logger_run_id(run_dir / "checkpoints" / "last.pt") if cfg.resume else ""
        offline = cfg.logger.mode == "offline" or (cfg.logger.mode == "auto" and not _wandb_logged_in())
        # mode= explicitly: Lightning's offline flag sets WANDB_MODE=dryrun, which recent wandb no longer honours.
        return WandbLogger(project=cfg.logger.project, entity=cfg.logger.get("entity"), name=cfg.run_name,
                           save_dir=str(run_dir), offline=offline, id=run_id or None, resume="allow",
                           mode="offline" if offline else "online", config=OmegaConf.to_container(cfg, resolve=True))
    raise ConfigError(f"logger.kind: unknown logger {kind!r}; choose wandb, csv or none")


def _wandb_logged_in() -> bool:
    if os.environ.get("WANDB_MODE") == "offline":
        return False
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        import wandb

        return bool(wandb.Api(timeout=5).api_key)
    except Exception:  # noqa: BLE001 - any failure means "not logged in": stay offline
        return False


def build_callbacks(cfg: DictConfig, run_dir: Path) -> list:
    from callbacks.evaluation import GlobalEvaluation
    from callbacks.progress import RichProgress
    from callbacks.reports import ClientReportLogger
    from callbacks.run_files import RunFiles
    from callbacks.weather import WeatherEvaluation

    attacks = build_attack_callbacks(cfg)
    privacy = None
    if attacks:
        from callbacks.privacy import PrivacyAttacks

        privacy = next((cb for cb in attacks if isinstance(cb, PrivacyAttacks)), None)
    cbs: list = [GlobalEvaluation(every=cfg.eval.every), ClientReportLogger(), *attacks]
    if cfg.eval.get("weather", False):  # after the attacks: re-runs them per condition on the same round's model
        cbs.append(WeatherEvaluation.from_config(cfg, run_dir, privacy=privacy))
    cbs += [RunFiles(run_dir=run_dir, resume=cfg.resume), RichProgress(enabled=cfg.progress)]
    return cbs


def build_attack_callbacks(cfg: DictConfig) -> list:
    """Attack callbacks are added only when configured (the attack group's `enabled` list)."""
    from resfl_lightning.attacks.settings import attack_settings

    settings = attack_settings(cfg.get("attack"))
    if not settings.enabled:
        return []
    from callbacks.privacy import AttackScores, PrivacyAttacks
    from callbacks.robustness import ByzantineAttack, DataPoisoning, EqualizedOdds
    from callbacks.update_aia import UpdateAttributeInference

    cbs: list = []
    if settings.on("byzantine"):
        cbs.append(ByzantineAttack(settings.byzantine, seed=cfg.seed))
    if settings.on("poisoning"):
        cbs.append(DataPoisoning(settings.poisoning, seed=cfg.seed, rounds=cfg.federation.rounds))
    if settings.on("mia") or settings.on("aia"):
        cbs.append(PrivacyAttacks(settings, seed=cfg.seed, mia=settings.on("mia"), aia=settings.on("aia")))
    if settings.on("update_aia"):
        cbs.append(UpdateAttributeInference(settings, seed=cfg.seed))
    if settings.on("eod"):
        cbs.append(EqualizedOdds(settings.protected_group, settings.eod.unprotected_group))
    cbs.append(AttackScores())  # last: reads what the attacks and the global evaluation added
    return cbs


@dataclass
class Job:
    federation: Federation

    def fit(self):
        return self.federation.fit()


def build_run(cfg: DictConfig) -> Job:
    validate_config(cfg)
    run_dir = Path(cfg.run_dir)
    from resfl_lightning.data.federated import build_federated_data, dataset_preflight

    dataset_preflight(cfg.dataset)  # fail fast (e.g. FACET missing) before processes start
    world = int(cfg.fabric.devices) * int(cfg.fabric.num_nodes) if str(cfg.fabric.devices).isdigit() else 1
    strategy = cfg.fabric.strategy if cfg.fabric.strategy != "auto" or world == 1 else "ddp"
    logger = build_logger(cfg, run_dir)
    fabric = L.Fabric(accelerator=cfg.fabric.accelerator, devices=cfg.fabric.devices, num_nodes=cfg.fabric.num_nodes,
                      strategy=strategy, precision=cfg.fabric.precision, loggers=logger,
                      callbacks=build_callbacks(cfg, run_dir))
    fabric.launch()
    if cfg.fabric.accelerator == "cpu":
        import torch

        torch.set_num_threads(int(cfg.fabric.threads_per_process))
    data = build_federated_data(cfg.dataset, seed=cfg.seed, rank_zero=fabric.is_global_zero, printer=fabric.print)
    factory = partial(build_client, cfg, data)
    aggregator = build_aggregator(cfg.algorithm.aggregation, beta=cfg.algorithm.beta, eps=cfg.algorithm.curv_eps)
    run_id = logger.version if (logger is not None and fabric.is_global_zero and cfg.logger.kind == "wandb") else ""
    federation = Federation(fabric=fabric, client_factory=factory, data=data, aggregator=aggregator,
                            settings=federation_settings(cfg), logger_run_id=str(run_id or ""), config=cfg)
    return Job(federation)
