"""`resfl compare CLEAN_RUN_DIR OTHER_RUN_DIR`: BA AD, DPA EODD, Privacy Score change and, with --fate-baseline, FATE
of two finished runs (resfl_lightning/analysis/compare.py). Writes OTHER_RUN_DIR/comparison.json, prints a table and,
with --wandb, logs to an offline W&B run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resfl compare", description=__doc__)
    parser.add_argument("clean_run", type=Path, help="run directory of the clean (or FedAvg baseline) run")
    parser.add_argument("other_run", type=Path, help="run directory of the attacked (or compared) run")
    parser.add_argument("--fate-baseline", action="store_true",
                        help="also compute FATE with CLEAN_RUN as the FedAvg baseline")
    parser.add_argument("--lambda-f", type=float, default=1.0, help="FATE's lambda_F (default 1)")
    parser.add_argument("--wandb", action="store_true", help="also log the comparison to an offline W&B run")
    parser.add_argument("--wandb-project", default="resfl-lightning")
    args = parser.parse_args(argv)
    from resfl_lightning.analysis.compare import compare_runs, log_wandb, print_table
    from resfl_lightning.analysis.run_data import load_run

    try:
        clean, other = load_run(args.clean_run), load_run(args.other_run)
    except (FileNotFoundError, json.JSONDecodeError) as err:
        print(f"compare: {err}", file=sys.stderr)
        return 2
    result = compare_runs(clean, other, fate_baseline=args.fate_baseline, lambda_f=args.lambda_f)
    out = args.other_run / "comparison.json"
    out.write_text(json.dumps(result, indent=2, sort_keys=True))
    print_table(result)
    print(f"wrote {out}")
    if args.wandb:
        log_wandb(result, args.other_run, args.wandb_project)
    return 0
