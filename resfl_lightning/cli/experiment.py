"""`resfl experiment NAME`: any experiment a grid file in conf/table/ declares (analysis/execute.py registered()),
with the options every experiment command shares. A new experiment is one module and one grid file; it runs here
without a command of its own.

  resfl experiment calibration --dataset synthetic --scenario group_skew --jobs 2
  resfl experiment calibration --dataset synthetic --check       (its held-out check seeds)
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from resfl_lightning.analysis.execute import load_experiment, registered
    from resfl_lightning.cli.experiment_args import add_run_options, context, execute_or_exit, experiment_parser, parse

    argv = sys.argv[1:] if argv is None else list(argv)
    known = registered()
    p = experiment_parser("resfl experiment", __doc__, "synthetic")
    p.add_argument("name", choices=sorted(known), help="the grid file's name in conf/table/")
    p.add_argument("--check", action="store_true", help="an experiment's held-out stage (calibration: check seeds)")
    add_run_options(p, "parent of the run folders (default runs/<name>-<dataset>-<scenario>...)",
                    "publish the report here (a .md file, or a folder)")
    args = parse(p, argv)
    ctx = context(args, argv, "resfl experiment", check=args.check)
    out, _ = execute_or_exit(load_experiment(known[args.name]), ctx)
    print(f"wrote {out}")
    return 0
