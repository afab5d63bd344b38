"""At the end of a run with W&B on: the offline report's figures (analysis/report.py) logged as images."""

from __future__ import annotations

from pathlib import Path

from resfl_lightning.analysis.report import log_report_figures


class ReportFigures:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def on_fit_end(self, federation) -> None:
        """Before RunFiles (which finalizes the loggers): metrics.jsonl already holds every round."""
        fabric = federation.fabric
        loggers = [lg for lg in fabric.loggers if hasattr(lg, "log_image")]
        if not fabric.is_global_zero or not loggers:
            return
        log_report_figures(self.run_dir, loggers)
