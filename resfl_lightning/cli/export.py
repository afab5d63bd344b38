"""`resfl export RUN_DIR`: write a finished detection run's global model again as an ultralytics checkpoint (e.g.
after export.enabled=false, or `--weights final` instead of the SWA average); resfl_lightning/trained/export.py.

`ultralytics.YOLO(PATH)` loads the file; `resfl predict PATH IMAGE ...` adds the evidence behind each box."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resfl export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="training run directory (holds config.yaml and checkpoints/last.pt)")
    p.add_argument("--out", type=Path, default=None, help="checkpoint to write (default RUN_DIR/export/global.pt)")
    p.add_argument("--weights", default="auto", choices=("auto", "final", "swa"),
                   help="auto: the SWA average once SWA has started (as evaluated), else the final global model")
    p.add_argument("--dataset", default=None, help="take conf/dataset/NAME.yaml instead of the run's dataset config")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides, e.g. dataset.root=/data/facet")
    args = p.parse_args(argv)
    from resfl_lightning.trained.export import export_run

    try:
        path = export_run(args.run_dir, args.out, args.weights, args.dataset, args.overrides)
    except (ValueError, FileNotFoundError) as err:
        print(f"export error: {err}", file=sys.stderr)
        return 2
    print(f"exported the global model to {path} (ultralytics.YOLO loads it)")
    return 0
