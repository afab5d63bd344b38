"""`python -m resfl_lightning <command> ...`: the same as `resfl <command> ...` (cli/__init__.py)."""

from __future__ import annotations

import sys

from resfl_lightning.cli import main

if __name__ == "__main__":
    sys.exit(main())
