"""Process-wide set-up: what must happen before ultralytics or wandb are imported, and the seed of the global RNGs."""

from __future__ import annotations

import os
from pathlib import Path

_CACHE = Path(os.environ["RESFL_CACHE_DIR"]) if "RESFL_CACHE_DIR" in os.environ else Path.cwd() / ".cache"


def cache_dir() -> Path:
    """The project-local cache ($RESFL_CACHE_DIR or ./.cache): ultralytics' settings, memoised pure computations."""
    return _CACHE


def configure_environment(num_threads: int | None = 1) -> None:
    """Keep ultralytics offline with a project-local settings dir and cap torch threads.

    One thread per process: on a 2-core machine two threads per process collapsed 10-20x under load.
    """
    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", str(_CACHE / "yolo"))
    os.environ.setdefault("YOLO_VERBOSE", "False")
    os.environ.setdefault("YOLO_AUTOINSTALL", "False")  # never pip-install at run time
    os.environ.setdefault("WANDB_SILENT", "true")
    if num_threads:
        import torch

        torch.set_num_threads(num_threads)


configure_environment(num_threads=None)


def seed_all(seed: int) -> None:
    """Seed python's, numpy's and torch's global RNGs (a client's local training, the initial model)."""
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def quiet_libraries() -> None:
    """faster_coco_eval prints its whole COCO table at INFO for every evaluation."""
    import logging

    for name in ("faster_coco_eval", "faster_coco_eval.core.cocoeval"):
        logging.getLogger(name).setLevel(logging.WARNING)


quiet_libraries()
