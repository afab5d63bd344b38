"""Turn a validated config into Fabric, logger, data, client factory, aggregator and callbacks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import lightning as L
from omegaconf import DictConfig, OmegaConf

from resfl_lightning.clients.base import AdversarySettings, LossWeights, OptimSettings, UfmSettings
from resfl_lightning.config import ConfigError, validate_config
from resfl_lightning.federation.aggregation import build_aggregator
from resfl_lightning.federation.checkpoint import read_logger_run_id
from resfl_lightning.federation.orchestrator import Federation, FederationSettings


def loss_weights(cfg: DictConfig) -> LossWeights:
    a = cfg.algorithm
    return LossWeights(lambda_priv=a.lambda_priv, lambda_fair=a.lambda_fair, lambda_curv=a.lambda_curv,
                       grl_scale=a.grl_scale, anneal_rounds=a.anneal_rounds, curv_iters=a.curv_iters,
                       curv_params=a.curv_params, lambda_task=a.get("lambda_task", 1.0),
                       w_fair=a.get("w_fair", 0.0))


def adversary_settings(cfg: DictConfig) -> AdversarySettings:
    a = cfg.algorithm
    return AdversarySettings(lr=a.adversary_lr, optimizer=a.adversary_optimizer, steps=a.adversary_steps,
                             hidden=a.adversary_hidden)


def swa_start_round(start, rounds: int) -> int | None:
    """algorithm.swa_start: a round index, a fraction of the horizon in (0, 1) (CurvFed starts at 16 of 80), or null."""
    if start is None:
        return None
    if isinstance(start, float) and 0 < start < 1:
        return int(round(start * rounds))
    return int(start)


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
        crash_after_round=cfg.debug.crash_after_round,
        swa_start=swa_start_round(a.get("swa_start"), int(f.rounds)), swa_every=a.get("swa_every", 1),
        swa_lr_high=a.get("swa_lr_high"), swa_lr_low=a.get("swa_lr_low"), sam_rho=a.get("sam_rho", 0.0),
        keep_best_epoch=a.get("keep_best_epoch", False),
        client_state_memory_mb=f.get("client_state_memory_mb", 256.0),
        relative_gate_k=float(cfg.ufm.gate_mad_k) if cfg.ufm.get("gate_mode", "absolute") == "relative" else None,
        clients_per_round=f.get("clients_per_round"), min_clients=int(f.get("min_clients", 1)),
        max_skipped_rounds=None if f.get("max_skipped_rounds") is None else int(f.max_skipped_rounds),
        fail_clients=tuple(str(x) for x in cfg.debug.get("fail_clients") or ()),
        kill_rank=cfg.debug.get("kill_rank"), kill_round=int(cfg.debug.get("kill_round", 0)),
    )


def build_client(cfg: DictConfig, data):
    """A fresh client module for the configured dataset, model and algorithm (DP-SGD and PrivFairFL hooks attached
    here, before any gradient exists, so every client and the global model share one layout)."""
    from resfl_lightning.baselines.setup import attach_baselines

    return attach_baselines(_task_client(cfg, data), cfg)


def _task_client(cfg: DictConfig, data):
    """A fresh client module (detection or tabular) for the configured dataset and model."""
    num_groups, num_classes = data.num_groups, data.num_classes
    if cfg.dataset.task == "detection":
        from resfl_lightning.clients.detection import DetectionClient
        from resfl_lightning.models.yolo import YoloSpec

        spec = YoloSpec(num_classes=num_classes, scale=cfg.model.scale, yaml=cfg.model.yaml,
                        image_size=cfg.dataset.image_size)
        return DetectionClient(spec, num_groups, loss_weights(cfg), ufm_settings(cfg), optim_settings(cfg),
                               adversary=adversary_settings(cfg))
    from resfl_lightning.clients.tabular import TabularClient

    return TabularClient(data.num_features, num_groups, loss_weights(cfg), ufm_settings(cfg), optim_settings(cfg),
                         hidden=tuple(cfg.model.hidden), num_classes=num_classes,
                         adversary=adversary_settings(cfg))


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
    from resfl_lightning.callbacks.evaluation import GlobalEvaluation
    from resfl_lightning.callbacks.progress import RichProgress
    from resfl_lightning.callbacks.reports import ClientReportLogger
    from resfl_lightning.callbacks.run_files import RunFiles
    from resfl_lightning.callbacks.weather import WeatherEvaluation

    evaluation = GlobalEvaluation(every=cfg.eval.every)
    attacks = build_attack_callbacks(cfg, evaluation)
    privacy = None
    if attacks:
        from resfl_lightning.callbacks.privacy import PrivacyAttacks

        privacy = next((cb for cb in attacks if isinstance(cb, PrivacyAttacks)), None)
    cbs: list = [evaluation, ClientReportLogger(), *attacks]
    if cfg.algorithm.get("post_calibration") is not None:  # PrivFairFL-Post: before the scores read test metrics
        from resfl_lightning.baselines.setup import post_calibration_settings
        from resfl_lightning.callbacks.post_calibration import PostCalibration

        cbs.insert(1, PostCalibration(post_calibration_settings(cfg), evaluation))
    if cfg.eval.get("weather", False):  # after the attacks: re-runs them per condition on the same round's model
        cbs.append(WeatherEvaluation.from_config(cfg, run_dir, privacy=privacy))
    if cfg.dataset.task == "detection" and cfg.export.enabled:
        from resfl_lightning.callbacks.export import ExportModel

        cbs.append(ExportModel(run_dir, weights=cfg.export.weights))
    if cfg.logger.kind == "wandb":  # the offline report's figures as W&B images (before RunFiles finalizes loggers)
        from resfl_lightning.callbacks.report_figures import ReportFigures

        cbs.append(ReportFigures(run_dir))
    cbs += [RunFiles(run_dir=run_dir, resume=cfg.resume), RichProgress(enabled=cfg.progress)]
    return cbs


def build_attack_callbacks(cfg: DictConfig, evaluation=None) -> list:
    """Attack callbacks are added only when configured (the attack group's `enabled` list). `evaluation` is the
    run's GlobalEvaluation, whose test pass the EOD measurement reuses."""
    from resfl_lightning.attacks.settings import attack_settings

    settings = attack_settings(cfg.get("attack"))
    if not settings.enabled:
        return []
    from resfl_lightning.callbacks.privacy import AttackScores, PrivacyAttacks
    from resfl_lightning.callbacks.robustness import ByzantineAttack, DataPoisoning, EqualizedOdds
    from resfl_lightning.callbacks.update_aia import UpdateAttributeInference

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
        cbs.append(EqualizedOdds(settings.protected_group, settings.eod.unprotected_group, evaluation=evaluation))
    cbs.append(AttackScores())  # last: reads what the attacks and the global evaluation added
    return cbs


@dataclass
class Job:
    federation: Federation

    def fit(self):
        return self.federation.fit()


def build_run(cfg: DictConfig) -> Job:
    validate_config(cfg)
    from resfl_lightning.baselines.setup import validate_baselines

    validate_baselines(cfg)
    run_dir = Path(cfg.run_dir)
    from resfl_lightning.data.federated import build_federated_data, dataset_preflight

    dataset_preflight(cfg.dataset)  # fail fast (e.g. FACET missing) before processes start
    world = int(cfg.fabric.devices) * int(cfg.fabric.num_nodes) if str(cfg.fabric.devices).isdigit() else 1
    strategy = cfg.fabric.strategy if cfg.fabric.strategy != "auto" or world == 1 else "ddp"
    from resfl_lightning.federation.collectives import build_strategy

    strategy = build_strategy(strategy, world, float(cfg.fabric.get("timeout_s", 1800)))
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
    aggregator = build_aggregator(cfg.algorithm.aggregation, beta=cfg.algorithm.beta, eps=cfg.algorithm.curv_eps,
                                  fairfed_beta=cfg.algorithm.get("fairfed_beta", 1.0))
    run_id = logger.version if (logger is not None and fabric.is_global_zero and cfg.logger.kind == "wandb") else ""
    federation = Federation(fabric=fabric, client_factory=factory, data=data, aggregator=aggregator,
                            settings=federation_settings(cfg), logger_run_id=str(run_id or ""), config=cfg)
    return Job(federation)
