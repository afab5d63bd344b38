"""`resfl privacy`: the privacy comparison, RESFL and FedAvg on the same data and seed, each attacked by the
honest-but-curious server (attack=privacy), reported side by side (resfl_lightning/analysis/privacy_report.py).

With --robustness each algorithm also gets a Byzantine and a poisoning run (BA AD and DPA EODD against its privacy
run). The table goes to stdout, everything to OUT/privacy_report.json."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from resfl_lightning.analysis.privacy_report import print_report, privacy_report
from resfl_lightning.attacks.byzantine import REPORT_MODES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resfl privacy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/privacy-report"), help="parent of the run directories")
    parser.add_argument("--algorithms", nargs="+", default=["resfl", "fedavg"])
    parser.add_argument("--robustness", action="store_true", help="also run attack=byzantine and attack=poisoning")
    parser.add_argument("--byzantine-reports", nargs="+", default=["honest"], choices=list(REPORT_MODES),
                        help="with --robustness: one Byzantine run per report mode (attack.byzantine.report)")
    parser.add_argument("--reuse", action="store_true", help="skip runs whose summary.json already exists")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run, e.g. federation.rounds=10")
    args = parser.parse_args(argv)
    try:
        report = privacy_report(args.out, args.algorithms, list(args.overrides), args.robustness,
                                tuple(args.byzantine_reports), args.reuse)
    except ValueError as err:
        parser.error(str(err))
    except (RuntimeError, FileNotFoundError) as err:
        print(f"privacy_report: {err}", file=sys.stderr)
        return 1
    print_report(report)
    print(f"wrote {args.out / 'privacy_report.json'}")
    return 0
