"""Reading the robustness grid's finished runs: per run its utility, EOD, attackers' weight share and FLTrust's root
ratio; per cell the per-seed paired numbers against its clean reference (BA AD, ΔEOD); per defence and f/n its worst
cell."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from resfl_lightning.analysis.robustness_decision import held_out_seeds
from resfl_lightning.analysis.robustness_grid import CLEAN, Cell, clean_of
from resfl_lightning.analysis.run_data import RunData
from resfl_lightning.metrics.robustness import relative_drop
from resfl_lightning.metrics.statistics import no_positive_at_threshold
from resfl_lightning.values import finite

WEIGHT_SHARE = "attack/byzantine_weight_share"  # per round in metrics.jsonl
ROOT_RATIO = "aggregation/fltrust_root_norm_ratio"  # per round: ||g_0|| / median ||d_i|| (FLTrust's fidelity)
ROOT_RATIO_BAND = (0.5, 2.0)  # docs/robustness-protocol.md "Defence fidelity options"


def run_values(run: RunData | None) -> dict[str, float | None]:
    """Final utility (accuracy, or mAP@50-95 on detection), final EOD, and the attackers' mean weight share over the
    rounds of a finished run; None where absent (and everywhere for a run that has not finished). A run with TPR 0 in
    every group at the operating threshold has no EOD here (`nothing_detected`: its EOD is 0 - 0, and an attacked run
    that detects nobody would read as a fairness gain)."""
    if run is None:
        return {"utility": None, "eod": None, "weight_share": None, "floor": None, "root_ratio": None,
                "nothing_detected": False}
    utility, floor = run.value("test/map"), 0.0  # detection: a model that learned nothing has mAP 0
    if utility is None:
        utility, floor = run.value("test/accuracy"), run.value("test/majority_class_rate")
    shares = [share for row in run.rows if (share := finite(row.get(WEIGHT_SHARE))) is not None]
    ratios = [ratio for row in run.rows if (ratio := finite(row.get(ROOT_RATIO))) is not None]
    nothing = no_positive_at_threshold(run.summary) is not None
    return {"utility": utility, "eod": None if nothing else run.value("test/eod"),
            "weight_share": float(np.mean(shares)) if shares else None, "floor": floor,
            "root_ratio": (min(ratios), max(ratios)) if ratios else None, "nothing_detected": nothing}


def ba_ad(clean: float | None, attacked: float | None) -> float | None:
    """BA AD (metrics/robustness.py's relative_drop, the one definition); None where either is missing or the clean
    utility is 0."""
    if clean is None or attacked is None or clean == 0:
        return None
    return relative_drop(clean, attacked)


@dataclass(frozen=True)
class CellResult:
    cell: Cell
    ba_ad: dict[int, float]       # seed -> BA AD
    utility: dict[int, float]
    delta_eod: dict[int, float]   # seed -> EOD_attacked - EOD_clean
    weight_share: dict[int, float]
    missing: int                  # seeds without a finished pair
    # seed -> the BA AD of a model at the floor (majority-class accuracy; mAP 0), read from the clean run
    floor_ba_ad: dict[int, float] = field(default_factory=dict)
    root_ratio: dict[int, tuple[float, float]] = field(default_factory=dict)  # seed -> FLTrust's (min, max) over rounds


def cell_results(values: dict[tuple[Cell, int], dict], cells: list[Cell], seeds: list[int],
                 grid: dict | None = None) -> dict[Cell, CellResult]:
    """Per cell the per-seed paired numbers, from {(cell, seed): run_values}; each cell paired with clean_of(grid,
    cell) (without a grid: its defence's f = 0 clean cell)."""
    results = {}
    for cell in cells:
        clean = Cell(cell.defence, CLEAN, "honest", 0.0) if grid is None else clean_of(grid, cell)
        b, u, e, w, fl, rr, missing = {}, {}, {}, {}, {}, {}, 0
        for s in seeds:
            mine, base = values.get((cell, s), {}), values.get((clean, s), {})
            if mine.get("utility") is None:
                missing += 1
                continue
            u[s] = mine["utility"]
            drop = ba_ad(base.get("utility"), mine["utility"])
            if drop is not None:
                b[s] = drop
            if (floor := ba_ad(base.get("utility"), base.get("floor"))) is not None:
                fl[s] = floor
            if mine.get("root_ratio") is not None:
                rr[s] = tuple(mine["root_ratio"])
            if mine.get("eod") is not None and base.get("eod") is not None:
                e[s] = mine["eod"] - base["eod"]
            if mine.get("weight_share") is not None:
                w[s] = mine["weight_share"]
        results[cell] = CellResult(cell, b, u, e, w, missing, fl, rr)
    return results


def worst_cell(results: dict[Cell, CellResult], defence: str, fraction: float,
               seeds: tuple[int, ...] | None = None) -> CellResult | None:
    """The attacked cell (over attacks and report modes) with the largest mean BA AD at this f/n, the mean over
    `seeds` only where given (else over all its seeds)."""
    def on(r: CellResult) -> list[float]:
        return [v for s, v in r.ba_ad.items() if seeds is None or s in seeds]

    mine = [r for c, r in results.items() if c.defence == defence and c.attack != CLEAN and c.fraction == fraction
            and on(r)]
    return max(mine, key=lambda r: float(np.mean(on(r))), default=None)


def restricted(r: CellResult, seeds: tuple[int, ...]) -> CellResult:
    """The cell's numbers on `seeds` only."""
    def keep(values: dict[int, float]) -> dict[int, float]:
        return {s: v for s, v in values.items() if s in seeds}

    return replace(r, ba_ad=keep(r.ba_ad), utility=keep(r.utility), delta_eod=keep(r.delta_eod),
                   weight_share=keep(r.weight_share), missing=sum(s not in r.utility for s in seeds),
                   floor_ba_ad=keep(r.floor_ba_ad), root_ratio=keep(r.root_ratio))


def worst_case(results: dict[Cell, CellResult], grid: dict, defence: str, fraction: float) -> CellResult | None:
    """The worst case that criterion 1, the worst-case column and the figure read: worst_cell over all seeds; with
    decision.selection_seeds / evaluation_seeds, the cell chosen on the selection seeds, on the evaluation seeds."""
    held = held_out_seeds(grid)
    if held is None:
        return worst_cell(results, defence, fraction)
    w = worst_cell(results, defence, fraction, held.selection)
    return None if w is None else restricted(w, held.evaluation)
