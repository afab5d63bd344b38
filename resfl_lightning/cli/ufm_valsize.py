"""`resfl ufm-valsize RUN_DIR`: how many validation images per client UFM needs to rank clients by more than noise.

Eval only: the run's exported global model (RUN_DIR/export/global.pt) is evaluated on a larger validation split of the
same dataset and scenario; for each size n the clients' bootstrap SE of UFM on n of their validation images is set
against the spread of UFM across clients (resfl_lightning/analysis/ufm_valsize.py). Prints JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resfl ufm-valsize", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--images", type=int, default=4800, help="dataset.num_images of the enlarged dataset")
    p.add_argument("--val-fraction", type=float, default=0.6, help="dataset.val_fraction of the enlarged dataset")
    p.add_argument("--sizes", default="25,50,100,200,400")
    p.add_argument("--draws", type=int, default=10)
    a = p.parse_args(argv)
    from resfl_lightning.analysis.ufm_valsize import valsize_report

    try:
        report = valsize_report(a.run_dir, a.images, a.val_fraction, [int(s) for s in a.sizes.split(",")], a.draws)
    except ValueError as err:
        print(f"ufm-valsize: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1))
    return 0
