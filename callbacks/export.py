"""At the end of a detection run: runs/<run>/export/global.pt, an ultralytics checkpoint of the global model."""

from __future__ import annotations

from pathlib import Path

from resfl_lightning.models.export import class_names, export_global_model


class ExportModel:
    def __init__(self, run_dir: Path, weights: str = "auto"):
        if weights not in ("auto", "final", "swa"):
            raise ValueError(f"export.weights must be auto, final or swa, got {weights!r}")
        self.path = Path(run_dir) / "export" / "global.pt"
        self.weights = weights

    def on_fit_end(self, federation, model, layout, state) -> None:
        if not federation.fabric.is_global_zero:
            return
        path = export_global_model(model, layout, state, self.path, class_names(federation.data), self.weights)
        federation.fabric.print(f"exported the global model to {path} (ultralytics.YOLO loads it)")
