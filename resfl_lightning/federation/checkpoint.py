"""Round checkpoints: written atomically by rank 0, read back with weights_only=True."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch


@dataclass
class ServerState:
    """Everything needed to continue a run after round `round_idx` finished."""

    round_idx: int  # last completed round (-1 before the first)
    theta: torch.Tensor  # flat fp32 global parameters + float buffers
    int_buffers: dict[str, torch.Tensor]
    swa: torch.Tensor | None = None  # running SWA average of theta (CurvFed / FedSWA), if enabled
    swa_count: int = 0
    logger_run_id: str = ""
    extra: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def model_theta(self) -> torch.Tensor:
        """The model that is evaluated, exported and reported: the SWA average once SWA has started."""
        return self.swa if self.swa is not None and self.swa_count > 0 else self.theta


def _rng_state() -> dict:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached": float(np_state[4])},
        "python": list(random.getstate()[1]),
    }


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    random.setstate((3, tuple(state["python"]), None))


def save_checkpoint(path: Path, state: ServerState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "round_idx": state.round_idx, "theta": state.theta, "int_buffers": state.int_buffers,
        "swa": state.swa, "swa_count": state.swa_count,
        "logger_run_id": state.logger_run_id, "extra": state.extra, "rng": _rng_state(),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-write never leaves a truncated checkpoint


def load_checkpoint(path: Path, restore_rng: bool = True) -> ServerState:
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - re-raised with the file named
        raise RuntimeError(f"cannot read checkpoint {path}: {err}") from err
    missing = {"round_idx", "theta", "int_buffers"} - set(payload)
    if missing:
        raise KeyError(f"checkpoint {path} lacks keys {sorted(missing)}")
    if restore_rng and "rng" in payload:
        _set_rng_state(payload["rng"])
    # A checkpoint written before SWA, the logger id or the extra state were saved holds none of them.
    payload = {"swa": None, "swa_count": 0, "logger_run_id": "", "extra": {}, **payload}
    return ServerState(
        round_idx=int(payload["round_idx"]), theta=payload["theta"], int_buffers=payload["int_buffers"],
        swa=payload["swa"], swa_count=int(payload["swa_count"]), logger_run_id=str(payload["logger_run_id"]),
        extra=payload["extra"],
    )


def read_logger_run_id(path: Path) -> str:
    """The logger run id stored in a checkpoint, without touching RNG state ('' when absent)."""
    if not path.is_file():
        return ""
    return load_checkpoint(path, restore_rng=False).logger_run_id
