"""The config sections every run has (conf/train.yaml and the model / fabric / logger groups), and the dataset's
shared sub-sections (loader, recipe, quality_skew). A default here is what applies when no yaml sets the key;
conf/train.yaml sets the run's values. The dataset and algorithm sections are the classes their `_target_` names
(resfl_lightning/data/datasets/base.py, resfl_lightning/algorithms/base.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from resfl_lightning.config import rules
from resfl_lightning.config.fields import Section, setting

# Lightning Fabric's precision values (lightning.fabric.connector).
PRECISIONS = ("transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed",
              "32-true", "64-true", "64", "32", "16", "bf16", 64, 32, 16)


@dataclass(kw_only=True)
class FederationConfig(Section):
    section = "federation"

    rounds: int = setting(doc="communication rounds T (conf/train.yaml: the dataset's recipe)", ge=1)
    local_epochs: int = setting(doc="local epochs E per round", ge=1)
    server_lr: float = setting(1.0, "server step: theta_G += server_lr * aggregate", gt=0)
    lr_milestones: list[int] = setting(doc="rounds at which the client lr is multiplied by lr_gamma", ge=0)
    lr_gamma: float = setting(0.1, "step-decay factor of the client lr", gt=0, le=1)
    clients_per_round: int | float | None = setting(
        None, "partial participation: null = every client, a count, or a fraction in (0, 1]")
    min_clients: int = setting(1, "quorum: a round with fewer usable client updates is skipped", ge=1)
    max_skipped_rounds: int | None = setting(None, "more skipped rounds in a row end the run (null: no limit)", ge=0)
    client_state_memory_mb: float = setting(256.0, "per-client state kept in memory before spilling to disk", gt=0)
    gather_memory_mb: float = setting(4096.0, "budget for a gather-all rule's stacked updates", gt=0)
    client_validation: str = setting(
        "every_round", "when_used: clients skip validating their model in a non-final round whose aggregation, "
        "update transforms and best-epoch selection read no evaluation (its report fields are NaN)",
        choices=("every_round", "when_used"))


@dataclass(kw_only=True)
class OptimSettings(Section):
    """The clients' local SGD."""

    section = "optim"

    lr: float = setting(1e-3, "client learning rate (conf/train.yaml: the dataset's recipe)", gt=0)
    momentum: float = setting(0.9, "SGD momentum", ge=0)
    weight_decay: float = setting(1e-4, "SGD weight decay", ge=0)
    grad_clip: float | None = setting(10.0, "gradient-norm clip (null: none)", gt=0)


@dataclass(kw_only=True)
class UfmSettings(Section):
    """UFM protocol knobs (docs/method.md)."""

    section = "ufm"
    checks = (rules.ufm_clip_order, rules.ufm_gate_off_needs_absolute_mode)

    score_threshold: float = setting(0.25, "detection score threshold of the UFM matching", ge=0, le=1)
    iou_threshold: float = setting(0.5, "IoU threshold of the UFM matching", ge=0, le=1)
    eps: float = setting(1e-6, "numerical floor of the UFM ratio", gt=0)
    evidence_floor: float = setting(1e-3, "floor of a group's mean evidence", gt=0)
    clip_low: float = setting(0.0, "reported u is clipped to [clip_low, clip_high]")
    clip_high: float = setting(5.0, "upper clip of u; also what a gated client reports")
    gate: float | None = setting(0.30, "absolute gate: val utility below it reports clip_high (null: no gate)",
                                 ge=0, le=1)
    gate_mode: str = setting("absolute", "absolute: `gate`; relative: median - gate_mad_k * MAD of the clients",
                             choices=("absolute", "relative"))
    gate_mad_k: float = setting(3.0, "k of the relative gate", ge=0)
    ema_decay: float | None = setting(0.9, "EMA of the raw UFM across a client's rounds (null: off)", ge=0, lt=1)
    min_group_persons: int = setting(1, "groups with fewer persons on a client's val split are left out", ge=1)
    insufficient_groups_u: float | None = setting(None, "u of a client left with < 2 groups (null: clip_high)")
    bootstrap_resamples: int = setting(200, "bootstrap resamples of each client's UFM SE (0: off)", ge=0)
    cohorts: str = setting("groups", "what UFM compares: the sensitive groups or label-free cohorts",
                           choices=("groups", "cluster", "slices", "proxy"))
    num_cohorts: int = setting(3, "number of label-free cohorts", ge=2)
    drop_fraction: float = setting(0.0, "share of group labels hidden from the client", ge=0, le=1)
    flip_rate: float = setting(0.0, "share of group labels flipped on the client", ge=0, le=1)

    @property
    def insufficient_u(self) -> float:
        return self.clip_high if self.insufficient_groups_u is None else float(self.insufficient_groups_u)


@dataclass(kw_only=True)
class ExportConfig(Section):
    section = "export"

    enabled: bool = setting(True, "detection runs write runs/<run>/export/global.pt at the end")
    weights: str = setting("auto", "auto: the SWA average once SWA started, else the final model",
                           choices=("auto", "final", "swa"))


@dataclass(kw_only=True)
class EvalConfig(Section):
    section = "eval"

    every: int = setting(5, "global evaluation every k rounds (and the last)", ge=1)
    final_validation: bool = setting(False, "also evaluate the final global model on the clients' validation splits "
                                     "(val/*: what `resfl tune` selects on; off by default, it costs a pass)")
    weather: bool = setting(False, "13-condition weather evaluation at the end (detection)")
    weather_every: int | None = setting(None, "also every k rounds (null: last round only)", ge=1)
    weather_seed: int = setting(0, "corruption seed, fixed across runs so conditions compare", ge=0)
    weather_mode: str = setting("auto", "how conditions are made", choices=("auto", "synthetic", "metadata"))
    weather_privacy: bool = setting(True, "with privacy attacks: re-run MIA / AIA per condition")


@dataclass(kw_only=True)
class MetricsConfig(Section):
    """How the group metrics are measured on an evaluated split (docs/method.md §6)."""

    section = "metrics"

    min_group_size: int = setting(
        1, "a group with fewer units (rows; detection: persons) on the evaluated split is left out of every group "
        "metric of it and named in the summary (1: every group kept, as published runs were measured; 30 advised "
        "for your own data)", ge=1)


@dataclass(kw_only=True)
class DebugConfig(Section):
    section = "debug"

    crash_after_round: int | None = setting(None, "raise after this round's checkpoint (tests resume)", ge=0)
    fail_clients: list[str] = setting([], "injected client faults '<client>:<round or *>:<fault>'")
    kill_rank: int | None = setting(None, "this rank SIGKILLs itself at the start of kill_round", ge=0)
    kill_round: int = setting(0, "round of kill_rank's SIGKILL", ge=0)


@dataclass(kw_only=True)
class FabricConfig(Section):
    section = "fabric"
    checks = (rules.fabric_devices,)

    accelerator: str = setting("cpu", "Fabric accelerator", choices=("cpu", "gpu", "cuda", "mps", "tpu", "auto"))
    devices: Any = setting(1, "processes per node: an integer >= 1, 'auto', device ids, or 'cores' (on the CPU one "
                              "process per usable core up to the clients, cores // processes threads each; else auto)")
    num_nodes: int = setting(1, "nodes (torchrun / SLURM)", ge=1)
    strategy: str = setting("auto", "Fabric strategy; auto becomes ddp with more than one process")
    precision: str | int = setting("32-true", "Fabric precision", choices=PRECISIONS)
    threads_per_process: int = setting(1, "torch threads per CPU process", ge=1)
    timeout_s: float = setting(1800.0, "collective timeout: a rank hanging this long stops every rank", gt=0)


@dataclass(kw_only=True)
class LoggerConfig(Section):
    section = "logger"

    kind: str = setting(doc="wandb | csv | none", choices=("wandb", "csv", "none"))
    project: str = setting("resfl-lightning", "W&B project")
    entity: str | None = setting(None, "W&B entity (null: the default one)")
    mode: str = setting("auto", "W&B: online when logged in, else offline", choices=("auto", "online", "offline"))


@dataclass(kw_only=True)
class ModelConfig(Section):
    section = "model"

    name: str = setting(doc="model family (conf/model/)")
    yaml: str = setting("yolov8.yaml", "detection: the ultralytics model yaml")
    scale: str = setting("n", "detection: YOLOv8 width/depth scale",
                         choices=("n", "s", "m", "l", "x", "pico", "femto"))
    hidden: list[int] = setting([256, 128, 64], "tabular: hidden layer widths", ge=1)


@dataclass(kw_only=True, frozen=True)
class LoaderSettings(Section):
    """dataset.loader: DataLoader worker processes, pinned host memory (fast, non-blocking copies to a GPU) and
    workers kept alive between epochs of one loader. Defaults keep everything in the training process; batches are
    pinned when the run's device is CUDA (`resolved`)."""

    section = "dataset.loader"
    checks = (rules.loader_workers,)

    num_workers: int = setting(0, "DataLoader worker processes", ge=0)
    pin_memory: bool | str = setting("auto", "pinned host memory (auto: on when the run's device is CUDA)",
                                     choices=(True, False, "auto"))
    persistent_workers: bool = setting(False, "keep workers alive between epochs (needs num_workers > 0)")
    prefetch_factor: int | None = setting(None, "batches each worker prepares ahead (null: torch's 2)", ge=1)

    def resolved(self, device_type: str) -> LoaderSettings:
        """These settings for a run on `device_type` (torch.device.type): pin_memory=auto pins only for "cuda", where
        pinned batches let Fabric's non-blocking host-to-device copies overlap the step; elsewhere pinning is
        useless (CPU) or unsupported."""
        if self.pin_memory != "auto":
            return self
        return replace(self, pin_memory=device_type == "cuda")

    def kwargs(self) -> dict:
        # An unresolved auto (data built without a device, e.g. in tests) pins nothing, as on a CPU run.
        out = {"num_workers": self.num_workers, "pin_memory": self.pin_memory is True,
               "persistent_workers": self.persistent_workers}
        if self.prefetch_factor is not None:
            out["prefetch_factor"] = self.prefetch_factor
        return out


@dataclass(kw_only=True)
class Recipe(Section):
    """The dataset's training recipe, read by conf/train.yaml (federation.rounds / local_epochs / lr_milestones,
    optim.lr)."""

    section = "dataset.recipe"

    rounds: int = setting(doc="rounds", ge=1)
    local_epochs: int = setting(doc="local epochs per round", ge=1)
    lr: float = setting(doc="client learning rate", gt=0)
    lr_milestones: list[int] = setting([], "lr decay rounds", ge=0)


@dataclass(kw_only=True, frozen=True)
class QualitySkewSettings(Section):
    """scenario=quality_skew: on a share of the clients one group's persons are dimmed and partly unlabelled."""

    section = "dataset.quality_skew"

    client_fraction: float = setting(0.5, "share of clients that are skewed", gt=0, le=1)
    group: int | None = setting(None, "the group made harder (null: the rarest in the clients' training data)",
                                ge=0)
    dim: float = setting(0.35, "pixel multiplier inside the group's boxes on skewed clients", gt=0, le=1)
    missing_rate: float = setting(0.3, "share of the group's training boxes missing on skewed clients", ge=0, le=1)
