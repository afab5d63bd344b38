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
    (run_config/tuned.py), or `cfg` itself when no tuned file applies."""
    import os

    from hydra import compose
    from hydra.core.hydra_config import HydraConfig

    from resfl_lightning.run_config.tuned import recompose

    hydra_cfg = HydraConfig.get()
    rank_zero = os.environ.get("RANK", "0") == "0" and os.environ.get("LOCAL_RANK", "0") == "0"
    again = recompose(list(hydra_cfg.overrides.task), hydra_cfg.runtime.choices,
                      lambda overrides: compose(config_name="train", overrides=overrides),
                      announce=print if rank_zero else None)
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


def check_overrides(args: list[str]) -> None:
    """A plain run's overrides composed once before Hydra starts, so that an unknown key or option is a config
    error of one line with exit status 2 (Hydra prints its own over several lines); with Hydra's flags (--cfg, -m,
    --help) Hydra reports them."""
    if any(a.startswith("-") for a in args):
        return
    from hydra import compose, initialize_config_dir

    from resfl_lightning.cli.input_errors import composition_errors, reported_input_errors

    with reported_input_errors(), composition_errors(), initialize_config_dir(config_dir=CONF_DIR,
                                                                              version_base="1.3"):
        compose(config_name="train", overrides=args)


def main(argv: list[str] | None = None) -> None:
    """Run the Hydra app on `argv` (default: the process's arguments); Hydra's flags (--help, --cfg, -m) work."""
    command_line = list(sys.argv)
    check_overrides(command_line[1:] if argv is None else list(argv))
    args = tuned_args_for_printing(command_line[1:] if argv is None else list(argv))
    _COMMAND_LINE[:] = command_line
    sys.argv = [command_line[0], *args]  # Hydra parses sys.argv[1:]
    try:
        app()
    finally:
        sys.argv = command_line
        _COMMAND_LINE.clear()
