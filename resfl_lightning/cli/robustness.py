"""`resfl robustness`: the Byzantine robustness grid pre-registered in docs/robustness-protocol.md
(conf/table/robustness.yaml; resfl_lightning/analysis/robustness.py): defences x attacks x report modes x attacker
fractions x seeds on one dataset and scenario, each attacked run paired with its defence's clean run. Resumable (a
finished run is skipped); a failed run does not stop the others. Writes DIR/robustness.md and DIR/robustness.png;
with --results PATH also PATH (and the figure beside it) under a header giving the command, commit and wall time.

  resfl robustness --dataset adult --subset core --results docs/results/robustness_adult_iid.md \\
      dataset.root=/path/to/adult"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from resfl_lightning.cli.experiment_args import add_run_options, experiment_parser, parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = experiment_parser("resfl robustness", __doc__, dataset="adult")
    p.add_argument("--subset", default=None, help="a named subset of the grid (conf/table/robustness.yaml: subsets)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default: the grid's, 5)")
    add_run_options(p, "default runs/robustness-<dataset>-<scenario>[-<subset>]",
                    "also write the table here with its provenance")
    return parse(p, argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    from resfl_lightning.analysis.robustness import RobustnessError, make_robustness_table

    tags = ["robustness", args.dataset, args.scenario, *([args.subset] if args.subset else [])]
    out = args.out or Path("runs") / "-".join(tags)
    try:
        out = make_robustness_table(args.dataset, args.scenario, args.subset, args.seeds, args.jobs, out,
                                    list(args.overrides), args.results,
                                    command=shlex.join(["resfl", "robustness", *argv]))
    except RobustnessError as err:
        raise SystemExit(str(err)) from None
    print((out / "robustness.md").read_text())
    return 0
