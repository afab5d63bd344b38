"""Table runs that an earlier invocation left unfinished (killed, machine stopped) continue from their last round's
checkpoint instead of starting over, as `resfl train resume=true` does (a resumed run ends bitwise where an
uninterrupted one does: tests/integration/test_train_end_to_end.py, test_resume_attack_state.py).

A run is resumed only when its checkpoint is of a round before the last (a checkpoint of the last round may lack
what the run writes after it) and its saved config is what the command composes now (analysis/run_settings.py);
otherwise it starts over, as before. Its recorded wall time is the work that counts: each earlier attempt from its
start to its last checkpoint, plus the attempt that finished.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

ATTEMPT_FILE = "table_attempt.json"  # {"started": epoch s, "prior_s": work of earlier attempts, "attempt": n}
_COMPOSE = threading.Lock()  # Hydra's composition is process-global; the launcher's worker threads take turns


def _checkpoint(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "last.pt"


def checkpoint_round(run_dir: Path) -> int | None:
    """The last completed round of the run's checkpoint (None without a readable one)."""
    import torch

    try:
        return int(torch.load(_checkpoint(run_dir), map_location="cpu", weights_only=True)["round_idx"])
    except Exception:  # noqa: BLE001 - an unreadable checkpoint means "start over"
        return None


def planned_rounds(run_dir: Path) -> int | None:
    """federation.rounds of the run's saved config (None without one)."""
    from omegaconf import OmegaConf

    try:
        return int(OmegaConf.load(run_dir / "config.yaml").federation.rounds)
    except Exception:  # noqa: BLE001 - no config, no resume
        return None


def resumable_round(run_dir: Path, overrides: list[str]) -> int | None:
    """The round an unfinished run can continue after, or None when it must start over."""
    from resfl_lightning.analysis.run_settings import finished_run_mismatch

    round_idx, rounds = checkpoint_round(run_dir), planned_rounds(run_dir)
    if round_idx is None or rounds is None or not 0 <= round_idx < rounds - 1:
        return None
    with _COMPOSE:
        if finished_run_mismatch(run_dir, overrides):
            return None
    return round_idx


def earlier_work(run_dir: Path) -> tuple[float, int]:
    """(seconds of earlier attempts up to their last checkpoint, attempts so far) of a run about to resume; an attempt
    without a record (made before records were kept) counts 0 s."""
    try:
        record = json.loads((run_dir / ATTEMPT_FILE).read_text())
        done = max(0.0, _checkpoint(run_dir).stat().st_mtime - float(record["started"]))
        return float(record["prior_s"]) + done, int(record["attempt"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0, 1


def start_attempt(run_dir: Path, prior_s: float, attempt: int) -> None:
    (run_dir / ATTEMPT_FILE).write_text(json.dumps({"started": time.time(), "prior_s": prior_s, "attempt": attempt}))
