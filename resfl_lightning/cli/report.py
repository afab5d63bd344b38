"""`resfl report RUN_DIR [RUN_DIR ...] [--out DIR]`: offline figures and report.md of one or more runs (no W&B needed;
resfl_lightning/analysis/report.py).

Writes utility_fairness.png, group_tpr.png, clients_<run>.png and report.md with the summary table into DIR
(default: RUN_DIR/report for one run, ./report for several)."""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resfl report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run directories (runs/<run_name>)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: RUN_DIR/report for one run, ./report for several)")
    args = parser.parse_args(argv)
    from resfl_lightning.analysis.report import write_report

    try:
        path = write_report(args.run_dirs, args.out)
    except (FileNotFoundError, ValueError) as err:
        parser.exit(2, f"report: {err}\n")
    print(f"wrote {path}")
    return 0
