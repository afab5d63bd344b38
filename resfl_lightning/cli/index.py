"""`resfl index`: the verdict matrix — every claim of conf/table/claims.yaml x the comparison tables
conf/table/index.yaml names — read from those tables' verdict sections in docs/results/, written to
docs/results/index.md and, with --readme, into the README between its matrix markers.

  resfl index --readme README.md"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resfl index", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-dir", type=Path, default=Path("docs/results"), help="where the tables' files are")
    p.add_argument("--readme", type=Path, default=None, help="also rewrite this README's matrix block")
    p.add_argument("--index", type=Path, default=None, help="the columns (default: conf/table/index.yaml)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    from resfl_lightning.analysis.experiment import ExperimentError, refuse_dirty_publish
    from resfl_lightning.analysis.portable_paths import portable_command
    from resfl_lightning.analysis.provenance import write_results
    from resfl_lightning.analysis.statistics import load_claims
    from resfl_lightning.analysis.verdict_index import load_index, matrix_lines, readme_block, with_block
    from resfl_lightning.resources import conf_dir

    start = time.perf_counter()
    out = args.results_dir / "index.md"
    try:
        refuse_dirty_publish(out)
        matrix = matrix_lines(load_index(args.index or conf_dir() / "table" / "index.yaml"), args.results_dir,
                              [claim.name for claim in load_claims()])
        readme = with_block(args.readme.read_text(), readme_block(matrix), str(args.readme)) if args.readme else None
    except (ExperimentError, OSError, ValueError) as err:
        raise SystemExit(f"resfl index: {err}") from None
    body = "\n".join(["# Verdict matrix: the papers' claims on each comparison table", "",
                      "Each cell is the verdict the table's own command wrote (docs/method.md §11) and the paired "
                      "difference to FedAvg with its 95 % Student-t interval (FATE: the ratio of means) over n seeds.",
                      "", *matrix, ""])
    write_results(out, body, portable_command(["resfl", "index", *argv]), time.perf_counter() - start,
                  writer="resfl index")
    if readme is not None:  # after the header read the commit: the README is outside docs/results
        args.readme.write_text(readme)
    print(f"wrote {out}" + (f" and the matrix in {args.readme}" if args.readme else ""))
    return 0
