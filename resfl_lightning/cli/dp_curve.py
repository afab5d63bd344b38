"""`resfl dp-curve`: the DP privacy-utility curve of the pre-registered grid conf/table/dp_curve.yaml
(resfl_lightning/analysis/dp_curve.py).

Trains every DP method (fedavg_dp, puffle, pfu_fl) x target epsilon (0.5, 1, 2, 8 and inf = clipping without noise)
x seed, and the non-DP ablations (FedAvg; FedAvg on the DP models' GroupNorm layout), utility only. Then writes
OUT/dp-curve.md (command, commit, date, machine and wall time; one row per method and epsilon with the utility's mean
and Student-t interval over the seeds, beside z, q, steps, C, delta, spent epsilon and NSR) and OUT/dp-curve.png
(utility against epsilon). Runs are resumable (a finished run is reused once its saved config matches its command);
--results DIR also writes the markdown and figure there.

  resfl dp-curve --dataset adult dataset.root=/path/to/adult
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from resfl_lightning.cli.experiment_args import add_run_options, context, execute_or_exit, experiment_parser, parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = experiment_parser("resfl dp-curve", __doc__, dataset="adult")
    p.add_argument("--grid", type=Path, default=None, help="default conf/table/dp_curve.yaml")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 instead of the grid's")
    add_run_options(p, "default runs/dp-curve-<dataset>-<scenario>[-<dataset.* overrides>]",
                    "also write the markdown and figure into this folder")
    return parse(p, argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.seeds is not None and args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    from resfl_lightning.analysis.dp_curve import DpCurve

    seeds = None if args.seeds is None else list(range(args.seeds))
    out, _ = execute_or_exit(DpCurve(), context(args, argv, "resfl dp-curve", grid=args.grid, seeds=seeds))
    print((out / "dp-curve.md").read_text())
    return 0
