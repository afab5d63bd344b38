"""The measured process of `resfl bench round` (benchmarks/round.py starts it; Fabric's launcher re-runs it for rank
1): the train entry point, unchanged, under the benchmark's timers. Not a user command."""

from __future__ import annotations

import os

from resfl_lightning.benchmarks.round import OUT_ENV, instrumented_run
from resfl_lightning.cli import train

if __name__ == "__main__":
    instrumented_run(train.main, os.environ[OUT_ENV])
