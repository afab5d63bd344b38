"""`resfl table`: every method (each preset of conf/algorithm/) x seed on one dataset and scenario, then the
comparison table with Student-t intervals, corrected paired tests, power and verdicts on the papers' claims
(resfl_lightning/analysis/table.py; conf/table/: columns.yaml, statistics.yaml, claims.yaml).

Runs are resumable: a finished run is skipped once its saved config is checked to be what its command composes to
now; a failed run does not stop the others. Writes DIR/table.md, DIR/table.csv, DIR/pareto.png; with --results PATH
also PATH (e.g. docs/results/<dataset>_<scenario>.md): table.md under a header giving the command, git commit, date,
machine and wall time."""

from __future__ import annotations

import argparse
import sys
import time

from resfl_lightning.cli.experiment_args import (
    add_run_options,
    comma_list,
    context,
    execute_or_exit,
    experiment_parser,
    parse,
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = experiment_parser("resfl table", __doc__, dataset="synthetic")
    p.add_argument("--methods", default=None, help="comma-separated subset of conf/algorithm/'s presets (default: "
                   "all; fedavg, the baseline, is always added)")
    p.add_argument("--seeds", type=int, default=None,
                   help="seeds of every method (default: conf/table/statistics.yaml's `seeds` for the dataset)")
    p.add_argument("--primary-seeds", type=int, default=None,
                   help="seeds of the primary methods (the baseline and the primary method of "
                   "conf/table/statistics.yaml), >= --seeds (default: the config's, or --seeds when that is given)")
    p.add_argument("--robustness", action="store_true", help="also run attack=byzantine and attack=poisoning")
    p.add_argument("--audit", action="store_true",
                   help="also run the membership audit with reference models (RMIA) per method and seed")
    p.add_argument("--audit-in-run", action="store_true",
                   help="--audit inside each privacy run (attack.mia.audit) instead of a run of its own: the same "
                   "audit from one training per method and seed, not two")
    p.add_argument("--wandb", action="store_true", help="also log the table as a W&B Table (offline)")
    add_run_options(p, "default runs/table-<dataset>-<scenario>[-<dataset.* overrides>]",
                    "also write table.md here with its provenance (command, commit, date, machine, wall time)")
    return parse(p, argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    from resfl_lightning.analysis.table import MethodTable

    t0 = time.perf_counter()
    ctx = context(args, argv, "resfl table", methods=comma_list(args.methods), seeds=args.seeds,
                  primary_seeds=args.primary_seeds, robustness=args.robustness, audit=args.audit or args.audit_in_run,
                  audit_in_run=args.audit_in_run, wandb=args.wandb)
    out, _ = execute_or_exit(MethodTable(), ctx)
    print((out / "table.md").read_text())
    if args.results is not None:
        print(f"results written to {args.results}")
    print(f"table written to {out} in {time.perf_counter() - t0:.0f} s")
    return 0
