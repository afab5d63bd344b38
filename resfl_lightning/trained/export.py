"""Export a finished run's global detector again, from RUN/checkpoints/last.pt (`resfl export`): e.g. a run trained
with export.enabled=false, or the final model of a run whose end-of-run export took the SWA average."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def export_run(run_dir: Path, out: Path | None = None, weights: str = "auto", dataset: str | None = None,
               overrides: Sequence[str] = ()) -> Path:
    """Write the run's global model (`weights`: auto | final | swa, models/export.py::choose_weights) as an
    ultralytics checkpoint to `out` (default RUN/export/global.pt); returns the path."""
    from resfl_lightning.models.export import class_names, export_global_model
    from resfl_lightning.trained.load import build_trained_model, load_detection_run

    run_dir = Path(run_dir)
    ckpt, cfg = load_detection_run(run_dir, dataset, overrides, "the export writes an ultralytics detector")
    data, client, layout, state = build_trained_model(cfg, ckpt)
    path = Path(out) if out is not None else run_dir / "export" / "global.pt"
    return export_global_model(client, layout, state, path, class_names(data), weights)
