"""A plain `resfl train` (overrides only, no Hydra flag) with its config composed once. Through `@hydra.main` a run
was composed three times, four with a tuned file: once by the command to report a bad override on one line, twice
by Hydra (once only to read `hydra.mode`, again to run), and again inside the app with the tuned file
(run_config/tuned.py). Here: once, and once more only when a tuned file applies, since the composed dataset,
algorithm and experiment choose the file (docs/performance.md, "Startup").

The rest is Hydra's `Hydra.run` after its composition (hydra-core 1.3): its callbacks and `run_job`, so the run
directory, the .hydra/ files (the config of the user's overrides, as before), the logging and `HydraConfig` are what
`@hydra.main` gives; the task trains with the tuned config. Hydra's flags (--cfg, -m, -r, --help) keep its own path.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from omegaconf import DictConfig

from resfl_lightning.run_config.tuned import override_key

CONFIG_NAME = "train"
VERSION_BASE = "1.3"


def is_plain(args: list[str]) -> bool:
    """Overrides only: no Hydra flag and no `hydra.mode` (a mode Hydra decides itself)."""
    return not any(a.startswith("-") or override_key(a) == "hydra.mode" for a in args)


def tuned_announce() -> Callable[[str], None] | None:
    """print on rank 0 (Fabric's launcher re-runs the command for the other ranks), else None."""
    rank_zero = os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"
    return print if rank_zero else None


def composed(hydra, args: list[str]) -> tuple[DictConfig, DictConfig | None]:
    """(the config of `args` with its hydra node, the tuned task config or None when no tuned file applies); a bad
    override or tuned file raises ConfigError."""
    from hydra import compose
    from hydra.types import RunMode

    from resfl_lightning.cli.input_errors import composition_errors
    from resfl_lightning.run_config.tuned import recompose

    with composition_errors():  # "hydra.mode=RUN": what Hydra adds to a run whose config sets no mode
        cfg = hydra.compose_config(CONFIG_NAME, [*args, "hydra.mode=RUN"], run_mode=RunMode.RUN,
                                   with_log_configuration=True)
        tuned = recompose(args, cfg.hydra.runtime.choices,
                          lambda overrides: compose(config_name=CONFIG_NAME, overrides=overrides),
                          announce=tuned_announce())
    return cfg, tuned


def run_job(hydra, cfg: DictConfig, task: Callable[[DictConfig], object]):
    """Hydra.run from its composition on: callbacks around run_job; the task's exception is raised again."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job as hydra_run_job
    from hydra.types import HydraContext

    callbacks = Callbacks(cfg)
    callbacks.on_run_start(config=cfg, config_name=CONFIG_NAME)
    ret = hydra_run_job(hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
                        task_function=task, config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None,
                        configure_logging=True)
    callbacks.on_run_end(config=cfg, config_name=CONFIG_NAME, job_return=ret)
    return ret.return_value


def run_once(args: list[str], config_dir: str, task: Callable[[DictConfig], object]) -> None:
    """Compose `args` against `config_dir` and run `task` on the config (the tuned one when a file applies) as
    Hydra's job; the job is named after `task`'s module, as `@hydra.main` names it."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
        run_and_report,
    )
    from hydra.core.global_hydra import GlobalHydra

    version.setbase(VERSION_BASE)
    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task)
    search_path = create_automatic_config_search_path(calling_file, calling_module, config_dir)
    hydra = run_and_report(lambda: Hydra.create_main_hydra2(detect_task_name(calling_file, calling_module),
                                                            search_path))
    try:
        cfg, tuned = composed(hydra, args)
        run_and_report(lambda: run_job(hydra, cfg, lambda task_cfg: task(task_cfg if tuned is None else tuned)))
    finally:
        GlobalHydra.instance().clear()
