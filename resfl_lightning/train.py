"""`python -m resfl_lightning.train key=value ...`: the same as `resfl train key=value ...` (cli/train.py)."""

from __future__ import annotations

from resfl_lightning.cli.train import CONF_DIR, main, run  # noqa: F401  (the names this module always offered)

if __name__ == "__main__":
    main()
