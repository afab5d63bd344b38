"""`resfl privacy`: the privacy comparison, RESFL and FedAvg on the same data and seed, each attacked by the
honest-but-curious server (attack=privacy), reported side by side (resfl_lightning/analysis/privacy_report.py).

With --robustness each algorithm also gets a Byzantine and a poisoning run (BA AD and DPA EODD against its privacy
run). The table goes to stdout, everything to OUT/privacy_report.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from resfl_lightning.attacks.byzantine import REPORT_MODES


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="resfl privacy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None,
                        help="parent of the run directories (default runs/privacy-report[-<dataset.* overrides>])")
    parser.add_argument("--algorithms", nargs="+", default=["resfl", "fedavg"])
    parser.add_argument("--robustness", action="store_true", help="also run attack=byzantine and attack=poisoning")
    parser.add_argument("--byzantine-reports", nargs="+", default=["honest"], choices=list(REPORT_MODES),
                        help="with --robustness: one Byzantine run per report mode (attack.byzantine.report)")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at once, each one process")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. federation.rounds=10")
    args = parser.parse_args(argv)
    from resfl_lightning.analysis.execute import Context
    from resfl_lightning.analysis.portable_paths import portable_command
    from resfl_lightning.analysis.privacy_report import PrivacyComparison, print_report
    from resfl_lightning.cli.experiment_args import execute_or_exit

    comparison = PrivacyComparison()
    ctx = Context("", "", list(args.overrides), args.jobs, portable_command(["resfl", "privacy", *argv]),
                  args.out, None, {"algorithms": args.algorithms, "robustness": args.robustness,
                                   "byzantine_reports": tuple(args.byzantine_reports)})
    out, _ = execute_or_exit(comparison, ctx)
    print_report(comparison.result)
    print(f"wrote {out / 'privacy_report.json'}")
    return 0
