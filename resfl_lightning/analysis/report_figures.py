"""At the end of a run with W&B on: the offline report's figures (report.py) logged as images. `resfl train`
installs the callback (cli/train.py): the run's own callbacks (builders.py) sit below analysis/ and never import it."""

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


def report_figures(cfg) -> list:
    """The callbacks `resfl train` adds to a run of the validated config `cfg`: ReportFigures when it logs to W&B."""
    return [ReportFigures(Path(cfg.run_dir))] if cfg.logger.kind == "wandb" else []
