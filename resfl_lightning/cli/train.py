"""`resfl train`: one federated run, a Hydra app (compose config -> validate -> build objects -> Federation.fit).

    resfl train dataset=synthetic algorithm=resfl fabric.devices=2      (also: python -m resfl_lightning.train ...)
    resfl train --help | --cfg job | -m algorithm.beta=0,2
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import resfl_lightning.env  # noqa: F401  (must precede ultralytics / wandb imports)
from resfl_lightning.cli.hydra_help import register as _register_help
from resfl_lightning.resources import conf_dir

CONF_DIR = str(conf_dir())  # resfl_lightning/conf when installed, conf/ in a checkout
_register_help(Path(CONF_DIR))  # `--help` lists the config groups and options

# The process's own command line: Hydra parses only the overrides, but Fabric's ddp launcher re-runs this command
# line for the other ranks, so it must still read `resfl train ...` when the app starts.
_COMMAND_LINE: list[str] = []


def run(cfg: DictConfig):
    """Build everything from a composed config and train; returns the final ServerState (rank-local). With W&B on,
    the offline report's figures are logged at the end (analysis/report_figures.py)."""
    from resfl_lightning.analysis.report_figures import report_figures
    from resfl_lightning.builders import build_run

    job = build_run(cfg, extra_callbacks=report_figures)
    return job.fit()


def apply_tuned(cfg: DictConfig) -> DictConfig:
    """The config composed again with conf/tuned/<dataset>/<algorithm>.yaml in front of the task's overrides
    (run_config/tuned.py), or `cfg` itself when no tuned file applies (Hydra's own path: -m and -r)."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    from resfl_lightning.cli.train_once import tuned_announce
    from resfl_lightning.run_config.tuned import recompose

    hydra_cfg = HydraConfig.get()
    again = recompose(list(hydra_cfg.overrides.task), hydra_cfg.runtime.choices,
                      lambda overrides: compose(config_name="train", overrides=overrides), announce=tuned_announce())
    return cfg if again is None else again


def tuned_args_for_printing(args: list[str]) -> list[str]:
    """`--cfg` prints the config without running the app: put the tuned file's overrides into the arguments, so the
    printed config is the one a run would train with (other flags: unchanged)."""
    if not any(a in ("--cfg", "-c") for a in args):
        return args
    from hydra import compose, initialize_config_dir

    from resfl_lightning.run_config.tuned import with_tuned

    overrides = [a for a in args if not a.startswith("-") and "=" in a]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        composed = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    choices = dict(composed.hydra.runtime.choices)
    tuned_overrides, _, _ = with_tuned(overrides, choices)
    return [a for a in args if a not in overrides] + tuned_overrides


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def app(cfg: DictConfig) -> None:
    from resfl_lightning.cli.input_errors import reported_input_errors

    if _COMMAND_LINE:
        sys.argv = list(_COMMAND_LINE)
    with reported_input_errors():  # a config or data error: one line, exit status 2
        run(apply_tuned(cfg))


def train_job(cfg: DictConfig) -> None:
    """A plain run's task (cli/train_once.py composed `cfg`, tuned file applied)."""
    from resfl_lightning.cli.input_errors import reported_input_errors

    with reported_input_errors():
        run(cfg)


def main(argv: list[str] | None = None) -> None:
    """Run `argv` (default: the process's arguments): overrides alone are composed once (cli/train_once.py); with
    Hydra's flags (--help, --cfg, -m, -r) Hydra's app runs them."""
    from resfl_lightning.cli.train_once import is_plain, run_once

    command_line = list(sys.argv)
    args = command_line[1:] if argv is None else list(argv)
    if is_plain(args):  # sys.argv stays the command line: Fabric's launcher re-runs it for the other ranks
        from resfl_lightning.cli.input_errors import reported_input_errors

        with reported_input_errors():  # a bad override or tuned file: one line, exit status 2
            run_once(args, CONF_DIR, train_job)
        return
    args = tuned_args_for_printing(args)
    _COMMAND_LINE[:] = command_line
    sys.argv = [command_line[0], *args]  # Hydra parses sys.argv[1:]
    try:
        app()
    finally:
        sys.argv = command_line
        _COMMAND_LINE.clear()
