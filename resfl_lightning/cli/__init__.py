"""`resfl <command> ...`: one console command; each subcommand is a thin module here (parse -> build -> call the
library). Nothing in the library imports this package (tests/unit/test_import_graph.py checks it).

Subcommand modules are imported only when their command runs, so `resfl --help` stays fast (no torch import).
"""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple


class Command(NamedTuple):
    module: str  # resfl_lightning.cli.<module>, with main(argv) -> exit code
    summary: str


COMMANDS: dict[str, Command] = {
    "train": Command("train", "one federated run; Hydra overrides: `resfl train dataset=adult federation.rounds=3`"),
    "data": Command("data", "what a run's clients will see, without training: rows per split and group (train's keys)"),
    "table": Command("table", "every method x seed on one dataset and scenario, then the comparison table"),
    "robustness": Command("robustness", "the pre-registered Byzantine robustness grid: defences x attacks x f/n"),
    "frontier": Command("frontier", "the adversary's privacy-utility frontier and its pre-registered selection"),
    "dp-curve": Command("dp_curve", "the DP methods' privacy-utility curve over a pre-registered epsilon grid"),
    "tune": Command("tune", "the equal tuning budget: every method's grid, selected on validation into conf/tuned/"),
    "experiment": Command("experiment", "any experiment a conf/table/ grid file declares, e.g. `calibration`"),
    "index": Command("index", "the verdict matrix: each paper claim x the comparison tables (docs/results/index.md)"),
    "ledger": Command("ledger", "what a run ledger holds; drop entries a fix invalidates (`--drop EXP --match GLOB`)"),
    "compare": Command("compare", "paired-run metrics (BA AD, DPA EODD, FATE) of two finished runs"),
    "report": Command("report", "offline figures and report.md of one or more finished runs"),
    "privacy": Command("privacy", "the privacy comparison: methods attacked by the honest-but-curious server"),
    "bench": Command("bench", "benchmarks: step times, aggregation, round overhead, scale (`resfl bench round|scale`)"),
    "export": Command("export", "write a run's global detector again as an ultralytics checkpoint"),
    "predict": Command("predict", "an exported model's boxes with the evidence behind each (JSON)"),
    "finetune": Command("finetune", "fine-tune a run's model on clear frames, then evaluate 13 weather conditions"),
    "ufm-valsize": Command("ufm_valsize", "how many validation images per client UFM needs to rank clients"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS) + 2
    lines = ["usage: resfl <command> [options]        (also: python -m resfl_lightning <command> ...)", "",
             "resfl-lightning: RESFL / CurvFed federated learning simulator on PyTorch Lightning Fabric", "",
             "commands:"]
    lines += [f"  {name:<{width}}{cmd.summary}" for name, cmd in COMMANDS.items()]
    lines += ["", "`resfl <command> --help` documents each command; `resfl train --help` lists every config group."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0
    if args[0] == "--version":
        from resfl_lightning import __version__

        print(f"resfl-lightning {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"resfl: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"{__name__}.{COMMANDS[name].module}")
    from resfl_lightning.analysis.runner import StoppedStarting  # stdlib only: no torch import for `--help`
    from resfl_lightning.cli.input_errors import reported_input_errors

    try:
        with reported_input_errors():  # a config or data error: one line, exit status 2
            return int(module.main(rest) or 0)
    except StoppedStarting as stop:  # a planned stop, not a failure: what finished is kept for the next call
        print(stop, file=sys.stderr)
        return 0
