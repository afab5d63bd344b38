"""The whole run's config: every top-level key and section (conf/train.yaml and its groups), the method and the
dataset among them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resfl_lightning.algorithms.base import Algorithm
from resfl_lightning.config.fields import Section, setting
from resfl_lightning.config.sections import (
    DebugConfig,
    EvalConfig,
    ExportConfig,
    FabricConfig,
    FederationConfig,
    LoggerConfig,
    MetricsConfig,
    ModelConfig,
    OptimSettings,
    UfmSettings,
)
from resfl_lightning.data.datasets.base import FederatedDataset
from resfl_lightning.run_config import rules


@dataclass(kw_only=True)
class RunConfig(Section):
    checks = rules.RUN_RULES

    seed: int = setting(0, "run seed: partition, client seeds, initial weights", ge=0)
    run_name: str = setting(doc="the run's name (conf/train.yaml derives it from the method and its weights)")
    run_dir: str = setting(doc="where checkpoints, metrics and exports go")
    resume: bool = setting(False, "continue from run_dir/checkpoints/last.pt")
    progress: bool = setting(True, "rich progress bar")
    use_tuned: bool = setting(True, "apply conf/tuned/<dataset>/<algorithm>.yaml when it exists (run_config/tuned.py)")
    tuned_file: str | None = setting(None, "the tuned file applied to this run (set by run_config/tuned.py)")
    scenario_name: str = setting("iid", "the data scenario (conf/scenario/) the run was composed with")
    model: ModelConfig = setting(doc="the model group (conf/model/)")
    dataset: FederatedDataset = setting(doc="the dataset: its class in `_target_` (conf/dataset/)")
    algorithm: Algorithm = setting(doc="the method: its class in `_target_` (conf/algorithm/)")
    aggregation: Any = setting(None, "the server's rule: `_target_` + parameters (conf/aggregation/)")
    attack: Any = setting(None, "attacks run on the federation (conf/attack/; resfl_lightning/attacks/settings.py)")
    federation: FederationConfig = setting(doc="rounds, participation, quorum")
    optim: OptimSettings = setting(doc="the clients' local SGD")
    ufm: UfmSettings = setting(doc="the UFM protocol")
    export: ExportConfig = setting(ExportConfig(), "the exported model")
    eval: EvalConfig = setting(doc="global and weather evaluation")
    metrics: MetricsConfig = setting(MetricsConfig(), "the group metrics' minimum group size")
    debug: DebugConfig = setting(DebugConfig(), "fault injection for tests")
    fabric: FabricConfig = setting(doc="processes, devices, precision")
    logger: LoggerConfig = setting(doc="W&B / CSV / none")
