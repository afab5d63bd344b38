"""`resfl ledger DIR`: what a run ledger (`--ledger DIR` of the experiment commands; analysis/run_ledger.py) holds,
one line per experiment: runs, chunks, the commits and dates they were recorded at.

`resfl ledger DIR --drop EXPERIMENT --match GLOB` removes the entries whose run names match, e.g. runs that logged a
metric a later fix corrects; delete the same run folders on the machine that continues, then the experiment's command
with `--ledger DIR` trains them again. Stop any command writing to the ledger first. Commit the ledger with the
reason.

`resfl ledger DIR --portable` rewrites entries recorded before entries held no machine paths: their data roots become
placeholders (dataset.root=<adult>) and paths in this checkout relative to it (analysis/portable_paths.py).

  resfl ledger docs/results/ledgers
  resfl ledger docs/results/ledgers --drop robustness-adult-race-iid --match 'krum-*'
  resfl ledger docs/results/ledgers --portable"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resfl ledger", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", type=Path)
    p.add_argument("--drop", metavar="EXPERIMENT", default=None, help="remove entries of this experiment folder")
    p.add_argument("--match", metavar="GLOB", default=None, help="run names to remove (with --drop)")
    p.add_argument("--portable", action="store_true", help="rewrite entries that hold this machine's paths")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    from resfl_lightning.analysis.run_ledger import drop, make_portable, summarise

    if not args.dir.is_dir():
        raise SystemExit(f"resfl ledger: {args.dir}: no such directory")
    if (args.drop is None) != (args.match is None):
        raise SystemExit("resfl ledger: --drop EXPERIMENT and --match GLOB go together")
    if args.portable:
        changed, chunks = make_portable(args.dir)
        print(f"{changed} entries made portable in {chunks} chunks")
        return 0
    if args.drop is not None:
        try:
            names = drop(args.dir, args.drop, args.match)
        except ValueError as err:
            raise SystemExit(f"resfl ledger: {err}") from None
        print(f"{args.drop}: {len(names)} entries dropped" + (f" ({names[0]} ... {names[-1]})" if names else ""))
        return 0
    for e in summarise(args.dir):
        print(f"{e.experiment}: {e.runs} runs in {e.chunks} chunks, recorded {e.first[:10]} to {e.last[:10]} at "
              f"{', '.join(e.commits)}")
    return 0
