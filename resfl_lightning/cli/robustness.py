"""`resfl robustness`: the Byzantine robustness grid pre-registered in docs/robustness-protocol.md
(conf/table/robustness.yaml; resfl_lightning/analysis/robustness.py): defences x attacks x report modes x attacker
fractions x seeds on one dataset and scenario, each attacked run paired with its defence's clean run. Resumable (a
finished run is skipped); a failed run does not stop the others. Writes DIR/robustness.md and DIR/robustness.png;
with --results PATH also PATH (and the figure beside it) under a header giving the command, commit and wall time.
With --check-clients it runs instead the check behind the subset's number of clients (its client_check:
analysis/client_check.py) and exits 1 if conf/table/robustness.yaml disagrees with the check's outcome.

  resfl robustness --dataset adult --subset core --results docs/results/robustness_adult_iid.md \\
      dataset.root=/path/to/adult"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.cli.experiment_args import add_run_options, context, execute_or_exit, experiment_parser, parse


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = experiment_parser("resfl robustness", __doc__, dataset="adult")
    p.add_argument("--grid", default="robustness",
                   help="the grid file in conf/table/ (default robustness, the published grid; robustness_v2: the "
                        "grid of docs/robustness-protocol.md's version 2)")
    p.add_argument("--subset", default=None, help="a named subset of the grid (the grid file's `subsets`)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default: the grid's, 5)")
    p.add_argument("--check-clients", action="store_true",
                   help="run the subset's client_check (FedAvg clean at each n on a tuning seed) instead of the grid")
    add_run_options(p, "default runs/robustness-<dataset>-<scenario>[-<dataset.* overrides>][-<subset>]",
                    "also write the table here with its provenance")
    return parse(p, argv)


def grid_file(name: str) -> Path | None:
    """The grid file `--grid` names (None: the published grid, conf/table/robustness.yaml)."""
    from resfl_lightning.analysis.execute import registered
    from resfl_lightning.analysis.robustness import RobustnessGrid

    if name == "robustness":
        return None
    target = f"{RobustnessGrid.__module__}.{RobustnessGrid.__name__}"
    known = {k: p for k, p in registered().items() if OmegaConf.load(p).get("_target_") == target}
    if name not in known:
        raise SystemExit(f"--grid {name}: conf/table/ has the robustness grids {['robustness', *sorted(known)]}")
    return known[name]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    ctx = context(args, argv, "resfl robustness", subset=args.subset, seeds=args.seeds)
    if args.check_clients:
        from resfl_lightning.analysis.client_check import ClientCheck

        if args.subset is None:
            raise SystemExit("--check-clients needs --subset (the subset whose client_check to run)")
        check = ClientCheck(grid_file(args.grid))
        out, _ = execute_or_exit(check, ctx)
        print((out / "client_check.md").read_text())
        return 0 if check.outcome.clients == check.configured else 1
    from resfl_lightning.analysis.robustness import RobustnessGrid

    out, _ = execute_or_exit(RobustnessGrid(grid_file(args.grid)), ctx)
    print((out / "robustness.md").read_text())
    return 0
