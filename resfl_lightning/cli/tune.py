"""`resfl tune`: the equal tuning budget (resfl_lightning/analysis/tune.py; conf/table/tune.yaml, conf/tune/).

Every method (each preset of conf/algorithm/, or --methods) gets the same number of trials over its own grid
conf/tune/<method>.yaml (trial 0: the preset) on the tuning seeds (default 126-128, disjoint from the tables' and the
frontier's). Per method the rule picks the trial with the highest mean VALIDATION utility (accuracy, or mAP@50 for
detection; the test split is never read) among those that learned (at least half of FedAvg's preset's gain over a
constant prediction on every seed); a method that claims fairness must keep its validation Fairness Score within the
stated margin of the preset's (of FedAvg's where its preset did not learn); a DP method's epsilon is never in a grid.
The selected overrides go to conf/tuned/<dataset>/<method>.yaml (merged with a file already there; none is written
when the preset itself wins), which `resfl train` then applies. Runs are resumable (OUT, default
runs/tune-<dataset>-<scenario>); the trial log goes to OUT/tune.md and --results (default
docs/results/tune-<dataset>-<scenario>[-<preset>].md) with its provenance."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from resfl_lightning.cli.experiment_args import (
    add_run_options,
    comma_list,
    context,
    execute_or_exit,
    experiment_parser,
    parse,
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = experiment_parser("resfl tune", __doc__, dataset="synthetic")
    p.add_argument("--methods", default=None, help="comma-separated subset of conf/algorithm/'s presets (default: all)")
    p.add_argument("--seeds", default=None,
                   help="comma-separated tuning seeds (default: conf/table/tune.yaml's tuning_seeds, 126,127,128, or "
                   "the dataset's tuning_seeds_by_dataset entry)")
    p.add_argument("--trials", type=int, default=None,
                   help="the first K trials of every grid (default: all, the budget of conf/table/tune.yaml); every "
                   "method still gets the same number")
    p.add_argument("--tuned-dir", type=Path, default=None,
                   help="write the tuned files into DIR/<dataset>/<method>.yaml instead of conf/tuned/")
    add_run_options(p, "default runs/tune-<dataset>-<scenario>[-<dataset.* overrides>]",
                    "the trial log (default docs/results/tune-<dataset>-<scenario>[-<dataset.* overrides>]"
                    "[-<preset>].md)")
    return parse(p, argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    from resfl_lightning.analysis.tune import Tune

    try:
        seeds = None if args.seeds is None else [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds: comma-separated integers, got {args.seeds!r}") from None
    ctx = context(args, argv, "resfl tune", methods=comma_list(args.methods), seeds=seeds, trials=args.trials,
                  tuned_dir=args.tuned_dir)
    out, _ = execute_or_exit(Tune(), ctx)
    print((out / "tune.md").read_text())
    return 0
