"""Shared test set-up: one thread per process (two threads on two cores collapse under load)."""

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RESFL_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _no_ledger_left_behind():
    """An experiment command's --ledger is process-wide (analysis/run_ledger.py): one test's must not reach the next."""
    yield
    from resfl_lightning.analysis import run_ledger

    run_ledger.use(None)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Real test data kept beside the checkout (never committed); tests needing it skip without it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared test data not found at {SHARED_DATA} (set RESFL_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def adult_dir(shared_data: Path) -> Path:
    """The original UCI Adult files (adult.data, adult.test) from the shared test data."""
    path = shared_data / "adult"
    if not (path / "adult.data").is_file():
        pytest.skip(f"Adult files not found under {path}")
    return path
