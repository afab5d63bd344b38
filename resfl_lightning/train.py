"""Hydra entry point: compose config -> validate -> build objects -> Federation.fit.

    python -m resfl_lightning.train dataset=synthetic algorithm=resfl fabric.devices=2
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import resfl_lightning.env  # noqa: F401  (must precede ultralytics / wandb imports)
from resfl_lightning.cli_help import register as _register_help
from resfl_lightning.resources import conf_dir

CONF_DIR = str(conf_dir())  # resfl_lightning/conf when installed, conf/ in a checkout
_register_help(Path(CONF_DIR))  # `--help` lists the config groups and options


def run(cfg: DictConfig):
    """Build everything from a composed config and train; returns the final ServerState (rank-local)."""
    from resfl_lightning.builders import build_run

    job = build_run(cfg)
    return job.fit()


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from resfl_lightning.config import ConfigError

    try:
        run(cfg)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
