"""Reading finished run directories: the comparison table and its columns, paired-run metrics, the offline report,
the privacy report, run-settings checks, the UFM validation-size study. The table and the privacy report train only
by starting `python -m resfl_lightning.train` processes."""
