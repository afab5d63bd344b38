"""Where the Hydra configs live: inside the package of an installed wheel, or at the top of a source checkout.

The design card keeps `conf/` at the repository's top level; the wheel installs the same files as
`resfl_lightning/conf/` (pyproject.toml maps them), so an installed `resfl train` finds them from any directory.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def conf_dir() -> Path:
    """The folder holding train.yaml and the config groups (installed package first, then the checkout)."""
    candidates = (PACKAGE_DIR / "conf", PACKAGE_DIR.parent / "conf")
    for candidate in candidates:
        if (candidate / "train.yaml").is_file():
            return candidate
    raise FileNotFoundError("resfl-lightning's configs (train.yaml) are in neither "
                            + " nor ".join(str(c) for c in candidates) + "; reinstall the package")
