"""The options every experiment command (table, robustness, frontier, tune, dp-curve) shares: which data, how many
runs at once, where runs and results go, and the Hydra overrides passed to every run."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def experiment_parser(prog: str, doc: str | None, dataset: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=dataset)
    p.add_argument("--scenario", default="iid")
    return p


def add_run_options(p: argparse.ArgumentParser, out_help: str, results_help: str) -> None:
    """--jobs, --out, --results and the trailing overrides (added last, after each command's own options)."""
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="runs trained at once, each one process (default: one per CPU core)")
    p.add_argument("--out", type=Path, default=None, help=out_help)
    p.add_argument("--results", type=Path, default=None, help=results_help)
    p.add_argument("--ledger", type=Path, default=None,
                   help="carry finished runs between machines: restore the runs this machine lacks from DIR and add "
                        "each run that finishes (analysis/run_ledger.py; commit DIR to continue elsewhere)")
    p.add_argument("--stop-starting-after", type=float, default=None, metavar="MINUTES",
                   help="start no run after MINUTES (e.g. before a session or a SLURM allocation ends): the runs in "
                        "flight finish and are kept, no results file is written, the same command continues")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for every run")


def parse(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The parsed options, with the counts checked (exit with the option's name)."""
    from resfl_lightning.analysis import run_ledger, runner
    from resfl_lightning.analysis.experiment import ExperimentError, refuse_dirty_publish

    args = p.parse_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {args.jobs}")
    try:
        refuse_dirty_publish(getattr(args, "results", None))  # before hours of runs, not after them
    except ExperimentError as err:
        raise SystemExit(str(err)) from None
    run_ledger.use(getattr(args, "ledger", None))  # reset on every parse: one command, one ledger
    try:
        runner.stop_starting_after(getattr(args, "stop_starting_after", None))  # likewise one deadline a command
    except ValueError as err:
        raise SystemExit(str(err)) from None
    return args


def comma_list(text: str | None) -> list[str] | None:
    return None if text is None else [item.strip() for item in text.split(",")]


def context(args: argparse.Namespace, argv: list[str], command: str, **options):
    """The experiment's Context from the shared options; `command` is the subcommand as typed (`resfl table`)."""
    from resfl_lightning.analysis.execute import Context
    from resfl_lightning.analysis.portable_paths import portable_command

    return Context(args.dataset, args.scenario, list(args.overrides), args.jobs,
                   portable_command([*command.split(), *argv]), args.out, args.results, options)


def execute_or_exit(experiment, ctx):
    """analysis/execute.py's execute; its ExperimentError ends the command with the message (exit 1)."""
    from resfl_lightning.analysis.execute import execute
    from resfl_lightning.analysis.experiment import ExperimentError

    try:
        return execute(experiment, ctx)
    except ExperimentError as err:
        raise SystemExit(str(err)) from None
