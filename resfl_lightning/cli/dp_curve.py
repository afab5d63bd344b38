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
import os
import shlex
import sys
from pathlib import Path


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resfl dp-curve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="adult")
    p.add_argument("--scenario", default="iid")
    p.add_argument("--grid", type=Path, default=None, help="default conf/table/dp_curve.yaml")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 instead of the grid's")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs trained at once, one process each")
    p.add_argument("--out", type=Path, default=None,
                   help="default runs/dp-curve-<dataset>-<scenario>[-<dataset.* overrides>]")
    p.add_argument("--results", type=Path, default=None, help="also write the markdown and figure into this folder")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {args.jobs}")
    if args.seeds is not None and args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    from resfl_lightning.analysis.dp_curve import CurveError, run_dp_curve

    seeds = None if args.seeds is None else list(range(args.seeds))
    try:
        path = run_dp_curve(args.dataset, args.scenario, list(args.overrides), args.jobs, args.out, args.results,
                            args.grid, seeds, shlex.join(["resfl", "dp-curve", *argv]))
    except CurveError as err:
        raise SystemExit(str(err)) from None
    print(path.read_text())
    return 0
