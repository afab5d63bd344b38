"""The DP-SGD accounting below a comparison table (issue 24: a DP method's row shows its noise and noise-to-signal
beside its utility). Per method that ran DP-SGD, its runs' summary.json `dp/` numbers, read and formatted exactly
as `resfl dp-curve` reads and formats them (analysis/dp_curve.py)."""

from __future__ import annotations

from pathlib import Path

from resfl_lightning.analysis.dp_curve import accounting_cells, run_values, same_cell

INTRO = ("DP-SGD accounting of the methods trained with it (summary.json `dp/`, as in `resfl dp-curve`): ε target "
         "the per-client target at δ, z the noise multiplier (the noise's std is z·C), q = B/n_k the Poisson sampling "
         "rate, S_k the DP-SGD steps a client took, C the clipping norm, δ (the value the seeds share, else their "
         "range); spent ε the accountant's ε (the largest over clients and seeds); NSR = zC/(B‖ḡ_c‖), the noise "
         "against the noise-free mean of the clipped per-sample gradients (median over steps and clients, then the "
         "mean over seeds). The utility at other ε: `resfl dp-curve`.")


def dp_accounting_lines(runs: dict[str, list[Path]]) -> list[str]:
    """The section's markdown lines for {method: its finished runs' folders}; [] when no method ran DP-SGD."""
    rows = []
    for method, run_dirs in runs.items():
        values = [v for v in map(run_values, run_dirs) if v is not None and v["z"] is not None]
        if values:
            target = same_cell([v["epsilon_target"] for v in values if v["epsilon_target"] is not None],
                               "epsilon_target")
            rows.append(f"| {method} | {len(values)} | {target} | " + " | ".join(accounting_cells(values)) + " |")
    if not rows:
        return []
    return ["", INTRO, "", "| method | n | ε target | z | q | S_k | C | δ | spent ε | NSR |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", *rows]
