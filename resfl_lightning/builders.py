"""Turn the validated config (resfl_lightning/run_config/load.py) into Fabric, logger, data, client factory, aggregator
and callbacks. Every function here takes the typed config `load_config` returns."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from omegaconf import DictConfig, OmegaConf

from resfl_lightning.aggregation.registry import build_aggregation
from resfl_lightning.algorithms.base import Algorithm
from resfl_lightning.attacks.registry import build_attack_callbacks, read_attacks, selected
from resfl_lightning.config.load import instantiate
from resfl_lightning.config.sections import OptimSettings, UfmSettings
from resfl_lightning.federation.checkpoint import read_logger_run_id
from resfl_lightning.federation.orchestrator import Federation, FederationSettings
from resfl_lightning.run_config.load import load_config


def algorithm_of(cfg: DictConfig) -> Algorithm:
    """The configured method (the class its `_target_` names)."""
    return instantiate(cfg.algorithm, Algorithm, "algorithm")


def ufm_settings(cfg: DictConfig) -> UfmSettings:
    return instantiate(cfg.ufm, UfmSettings, "ufm")


def optim_settings(cfg: DictConfig) -> OptimSettings:
    return instantiate(cfg.optim, OptimSettings, "optim")


def federation_settings(cfg: DictConfig) -> FederationSettings:
    f, a, d = cfg.federation, algorithm_of(cfg), cfg.debug
    return FederationSettings(
        rounds=f.rounds, local_epochs=f.local_epochs, server_lr=f.server_lr,
        lr_milestones=tuple(f.lr_milestones), lr_gamma=f.lr_gamma, seed=cfg.seed, resume=cfg.resume,
        run_dir=Path(cfg.run_dir), report_fim=a.report_fim, fim_iters=a.fim_iters,
        crash_after_round=d.crash_after_round,
        swa_start=a.swa_start_round(f.rounds), swa_every=a.swa_every, swa_lr_high=a.swa_lr_high,
        swa_lr_low=a.swa_lr_low, swa_bn_update=a.swa_bn_update, sam_rho=a.sam_rho, keep_best_epoch=a.keep_best_epoch,
        client_state_memory_mb=f.client_state_memory_mb, gather_memory_mb=f.gather_memory_mb,
        client_validation=f.client_validation,
        relative_gate_k=cfg.ufm.gate_mad_k if cfg.ufm.gate_mode == "relative" else None,
        clients_per_round=f.clients_per_round, min_clients=f.min_clients, max_skipped_rounds=f.max_skipped_rounds,
        fail_clients=tuple(d.fail_clients), kill_rank=d.kill_rank, kill_round=d.kill_round,
    )


class ClientFactory:
    """Fresh client modules of one run (the rank's live client, attack shadow models): the config, the algorithm and
    the client settings are checked and built once; each call builds a client for dataset.task and the algorithm
    attaches its plug-ins (before any gradient exists, so every client and the global model share one layout)."""

    def __init__(self, cfg: DictConfig, data):
        self.cfg, self.data = load_config(cfg), data
        self.algorithm = algorithm_of(self.cfg)
        self.ufm, self.optim = ufm_settings(self.cfg), optim_settings(self.cfg)
        self.row_weights = None  # Kamiran-Calders weights of every row (algorithm.local_reweighting)
        if self.algorithm.local_reweighting:  # a detection dataset was refused by the config rules
            from resfl_lightning.data.reweighing import split_row_weights

            self.row_weights = split_row_weights(data.groups, data.y, [c.train for c in data.splits.clients])

    def __call__(self):
        return self.algorithm.attach(self._task_client(), self.cfg)

    def _task_client(self):
        cfg, algorithm, data = self.cfg, self.algorithm, self.data
        weights, adversary = algorithm.loss_weights(), algorithm.adversary(cfg.federation.rounds)  # one per client
        if cfg.dataset.task == "detection":
            from resfl_lightning.clients.detection import DetectionClient
            from resfl_lightning.models.yolo import YoloSpec

            spec = YoloSpec(num_classes=data.num_classes, scale=cfg.model.scale, yaml=cfg.model.yaml,
                            image_size=cfg.dataset.image_size)
            return DetectionClient(spec, data.num_groups, weights, self.ufm, self.optim, adversary=adversary)
        from resfl_lightning.clients.tabular import TabularClient

        return TabularClient(data.num_features, data.num_groups, weights, self.ufm, self.optim,
                             hidden=tuple(cfg.model.hidden), num_classes=data.num_classes, adversary=adversary,
                             row_weights=self.row_weights)


def build_client(cfg: DictConfig, data):
    """One fresh client module for the configured dataset, model and algorithm (`cfg`: a composed config is
    validated first)."""
    return ClientFactory(cfg, data)()


def build_logger(cfg: DictConfig, run_dir: Path, composed: DictConfig):
    """The configured logger (None for logger.kind=none); W&B records `composed`, the config as composed."""
    kind = cfg.logger.kind
    if kind == "none":
        return None
    if kind == "csv":
        from lightning.fabric.loggers import CSVLogger

        return CSVLogger(root_dir=str(run_dir), name="csv", version=0)
    from lightning.pytorch.loggers import WandbLogger

    run_id = read_logger_run_id(run_dir / "checkpoints" / "last.pt") if cfg.resume else ""
    offline = cfg.logger.mode == "offline" or (cfg.logger.mode == "auto" and not _wandb_logged_in())
    # mode= explicitly: Lightning's offline flag sets WANDB_MODE=dryrun, which recent wandb no longer honours.
    return WandbLogger(project=cfg.logger.project, entity=cfg.logger.entity, name=cfg.run_name,
                       save_dir=str(run_dir), offline=offline, id=run_id or None, resume="allow",
                       mode="offline" if offline else "online", config=OmegaConf.to_container(composed, resolve=True))


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


def build_callbacks(cfg: DictConfig, run_dir: Path, algorithm: Algorithm, extra: Sequence = ()) -> list:
    """The run's callbacks in their order; `extra` (a command's own, e.g. `resfl train`'s W&B report figures) run
    after the run's measurements and before RunFiles, which finalizes the loggers."""
    from resfl_lightning.callbacks.evaluation import GlobalEvaluation
    from resfl_lightning.callbacks.progress import RichProgress
    from resfl_lightning.callbacks.reports import ClientReportLogger
    from resfl_lightning.callbacks.run_files import RunFiles
    from resfl_lightning.callbacks.weather import WeatherEvaluation

    evaluation = GlobalEvaluation(every=cfg.eval.every, final_validation=cfg.eval.final_validation,
                                  min_group_size=cfg.metrics.min_group_size)
    attacks = build_attack_callbacks(cfg, evaluation)
    privacy = None
    if attacks:
        from resfl_lightning.attacks.privacy_attacks import PrivacyAttacks

        privacy = next((cb for cb in attacks if isinstance(cb, PrivacyAttacks)), None)
    cbs: list = [evaluation, ClientReportLogger(), *attacks]
    cbs[1:1] = algorithm.server_callbacks(evaluation)  # e.g. PrivFairFL-Post: before the scores read test metrics
    if cfg.eval.weather:  # after the attacks: re-runs them per condition on the same round's model
        cbs.append(WeatherEvaluation.from_config(cfg, run_dir, privacy=privacy))
    if cfg.dataset.task == "detection" and cfg.export.enabled:
        from resfl_lightning.callbacks.export import ExportModel

        cbs.append(ExportModel(run_dir, weights=cfg.export.weights))
    cbs += [*extra, RunFiles(run_dir=run_dir, resume=cfg.resume, evaluation=evaluation),
            RichProgress(enabled=cfg.progress)]
    return cbs


@dataclass
class Job:
    federation: Federation

    def fit(self):
        return self.federation.fit()


def build_run(cfg: DictConfig, extra_callbacks: Callable[[DictConfig], Sequence] | None = None) -> Job:
    """Everything a run needs from the composed config. Nothing is built, launched or written before the config
    passed load_config (and the dataset its preflight). A group named by value is indexed first
    (run_config/group_names.py); the run keeps the config as composed. `extra_callbacks(validated config)` gives a
    command's own callbacks (build_callbacks places them)."""
    from resfl_lightning.run_config.group_names import with_group_indices

    composed, cfg = cfg, load_config(with_group_indices(cfg))
    selected(*read_attacks(cfg.attack))  # the attack and aggregation nodes are their registries' to check
    aggregator = build_aggregation(cfg.aggregation, report_fim=bool(cfg.algorithm.report_fim))
    from resfl_lightning.data.federated import build_federated_data, instantiate_dataset

    dataset = instantiate_dataset(cfg.dataset)
    dataset.preflight()  # fail fast (e.g. FACET missing) before processes start
    algorithm = algorithm_of(cfg)
    run_dir = Path(cfg.run_dir)
    from resfl_lightning.federation.cpu_layout import cpu_layout

    devices, threads = cpu_layout(cfg.fabric.devices, cfg.fabric.threads_per_process, cfg.dataset.num_clients,
                                  cfg.fabric.num_nodes, cfg.fabric.accelerator)
    world = int(devices) * cfg.fabric.num_nodes if str(devices).isdigit() else 1
    strategy = cfg.fabric.strategy if cfg.fabric.strategy != "auto" or world == 1 else "ddp"
    from resfl_lightning.federation.collectives import build_strategy

    strategy = build_strategy(strategy, world, cfg.fabric.timeout_s)
    logger = build_logger(cfg, run_dir, composed)
    fabric = L.Fabric(accelerator=cfg.fabric.accelerator, devices=devices, num_nodes=cfg.fabric.num_nodes,
                      strategy=strategy, precision=cfg.fabric.precision, loggers=logger,
                      callbacks=build_callbacks(cfg, run_dir, algorithm,
                                                extra_callbacks(cfg) if extra_callbacks is not None else ()))
    fabric.launch()
    if cfg.fabric.accelerator == "cpu":
        import torch

        torch.set_num_threads(threads)
    data = build_federated_data(dataset, seed=cfg.seed, rank_zero=fabric.is_global_zero, printer=fabric.print,
                                device_type=fabric.device.type)
    factory = ClientFactory(cfg, data)
    run_id = logger.version if (logger is not None and fabric.is_global_zero and cfg.logger.kind == "wandb") else ""
    # The run directory keeps the config as composed (callbacks/run_files.py): what a re-run composes compares to it.
    federation = Federation(fabric=fabric, client_factory=factory, data=data, aggregator=aggregator,
                            settings=federation_settings(cfg), server_plugins=algorithm.server_plugins(),
                            logger_run_id=str(run_id or ""), config=composed)
    return Job(federation)
