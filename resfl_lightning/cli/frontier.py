"""`resfl frontier`: the privacy-utility frontier of RESFL's adversary phi and its pre-registered selection
(conf/table/adversary_frontier.yaml; resfl_lightning/analysis/frontier.py).

Without --confirm: every grid point (phi strength x lambda_priv) plus FedAvg and FedAvg-DP on the tuning seeds with
attack=privacy, then OUT/frontier.md (grid, rule, per-point means with t-intervals, the selected point),
OUT/frontier.png and OUT/selection.json. With --confirm: the selected point, RESFL's default and FedAvg on the
confirmation seeds, then OUT/confirmation.md (paired differences with t-intervals). Runs are resumable (a finished
run is reused once its saved config matches its command); --results DIR also writes the markdown (and figure) there
with the command, commit, date, machine and wall time."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from resfl_lightning.cli.experiment_args import add_run_options, context, execute_or_exit, experiment_parser, parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = experiment_parser("resfl frontier", __doc__, dataset="adult")
    p.add_argument("--confirm", action="store_true", help="run the confirmation of OUT/selection.json")
    p.add_argument("--point", default=None, metavar="STRENGTH,LAMBDA_PRIV",
                   help="with --confirm: confirm this grid point (e.g. weak,0.1: the one a published frontier "
                        "selected) instead of OUT/selection.json, when the tuning runs are not on this machine")
    p.add_argument("--grid", type=Path, default=None, help="default conf/table/adversary_frontier.yaml")
    add_run_options(p, "default runs/frontier-<dataset>-<scenario>[-<dataset.* overrides>]",
                    "also write the markdown and figure into this folder")
    return parse(p, argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    from resfl_lightning.analysis.frontier import Frontier

    if args.point is not None and not args.confirm:
        raise SystemExit("--point names the point to confirm: use it with --confirm")
    frontier = Frontier()
    ctx = context(args, argv, "resfl frontier", grid=args.grid, confirm=args.confirm, point=args.point)
    out, report = execute_or_exit(frontier, ctx)
    print((out / report.name).read_text())
    if not args.confirm:
        print(frontier.selection.reason)
    return 0
