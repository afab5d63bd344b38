"""The robustness grid's pre-registered decision rule (docs/robustness-protocol.md, "Decision rule"): its four
criteria on the decision defence, each decided on 95 % Student-t intervals over seeds, never on a point estimate;
the harm gate that makes criterion 1 undecidable where the attacks do not hurt the baseline."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from resfl_lightning.analysis.robustness_decision import (
    clean_utility_test,
    held_out_seeds,
    noninferiority_detail,
    noninferiority_text,
)
from resfl_lightning.analysis.robustness_grid import CLEAN, Cell
from resfl_lightning.analysis.robustness_results import CellResult, worst_case
from resfl_lightning.metrics.intervals import interval_text
from resfl_lightning.metrics.statistics import TTest, paired_t, t_test


@dataclass(frozen=True)
class Criterion:
    text: str
    passed: bool | None  # None: the runs cannot decide it (cells missing, or an interval straddles the bound)
    detail: str


def at_most(t: TTest, bound: float) -> bool | None:
    """Decided on the 95 % interval, never the point: True when it lies at or below `bound`, False when it lies
    above, None when it straddles it (or fewer than 2 seeds give no interval)."""
    if t.n < 2:
        return None
    return True if t.high <= bound else (False if t.low > bound else None)


def at_least(t: TTest, bound: float) -> bool | None:
    """As at_most, for an interval that must lie at or above `bound`."""
    if t.n < 2:
        return None
    return True if t.low >= bound else (False if t.high < bound else None)


def all_of(verdicts: list[bool | None]) -> bool | None:
    """False when any is False, True when all are True, else None."""
    return False if False in verdicts else (True if verdicts and all(v is True for v in verdicts) else None)


def decided_fractions(grid: dict) -> list[float]:
    """The grid's f/n that the decision rule reads: those at or below decision.max_fraction."""
    return [f for f in grid["fractions"] if f <= grid["decision"]["max_fraction"] + 1e-9]


def harm_gate(results: dict[Cell, CellResult], grid: dict) -> str | None:
    """Why criterion 1 is undecidable on this dataset (None: it is decidable, or the grid sets no
    decision.baseline_harm): no attack at f/n = max_fraction drives the baseline's worst case to BA AD >= the bar or
    to the floor (the BA AD of a model at the majority-class accuracy / mAP 0), so a defence cannot be shown to
    remove harm that the attacks do not do."""
    rule = grid["decision"]
    bar = rule.get("baseline_harm")
    decided = decided_fractions(grid)
    if bar is None or not decided:  # no bar, or no f/n criterion 1 reads (a subset above max_fraction)
        return None
    f = max(decided)
    theirs = worst_case(results, grid, rule["baseline"], f)
    if theirs is None or not theirs.ba_ad:
        return f"no {rule['baseline']} attacked cell at f/n = {f} to check the harm bar on"
    harm = float(np.mean(list(theirs.ba_ad.values())))
    floor = float(np.mean(list(theirs.floor_ba_ad.values()))) if theirs.floor_ba_ad else None
    if harm >= bar or (floor is not None and harm >= floor):
        return None
    floor_text = "" if floor is None else f" and the floor's {floor:.3f} (a model at the majority-class accuracy)"
    return (f"{rule['baseline']}'s worst attack at f/n = {f} ({theirs.cell.attack}/{theirs.cell.report}) reaches BA AD "
            f"{harm:.3f}, below the bar {bar}{floor_text}: the attacks do not hurt the baseline enough to decide")


def decide(results: dict[Cell, CellResult], grid: dict) -> list[Criterion]:
    """The four criteria of docs/robustness-protocol.md for grid['decision']['defence'] at every f/n <= max, each
    decided on 95 % Student-t intervals over seeds (pass: the interval on the right side of the bound; fail: on the
    wrong side; else not decided at these seeds). The options of analysis/robustness_decision.py, where the grid
    gives them, read criterion 1 on held-out seeds and criterion 3 as a non-inferiority test."""
    rule = grid["decision"]
    me, base, ref = rule["defence"], rule["baseline"], rule["reference"]
    fractions = decided_fractions(grid)
    held = held_out_seeds(grid)
    out = []
    undecidable = harm_gate(results, grid)
    # 1. worst-case BA AD <= bound and >= margin below the baseline's worst case (paired interval)
    for f in fractions:
        mine, theirs = worst_case(results, grid, me, f), worst_case(results, grid, base, f)
        if mine is None or theirs is None:
            out.append(Criterion(f"worst-case BA AD at f/n = {f}", None, "cells missing"))
            continue
        if undecidable:
            out.append(Criterion(f"worst-case BA AD at f/n = {f}: undecidable here", None, undecidable))
            continue
        worst = t_test(list(mine.ba_ad.values()))
        gap = paired_t(theirs.ba_ad, mine.ba_ad)
        ok = all_of([at_most(worst, rule["worst_ba_ad"]), at_least(gap, rule["margin_vs_baseline"])])
        out.append(Criterion(
            f"worst-case BA AD at f/n = {f} <= {rule['worst_ba_ad']} and >= {rule['margin_vs_baseline']} below "
            f"{base}'s (95 % intervals)", ok,
            f"{me} {_t_text(worst)} ({mine.cell.attack}/{mine.cell.report}); "
            f"{base} {np.mean(list(theirs.ba_ad.values())):.3f} ({theirs.cell.attack}/{theirs.cell.report}); "
            f"{base} - {me} {_t_text(gap)}" + (f"; worst cells {held.text()}" if held else "")))
    # 2. lie - honest BA AD per attack
    diffs = []
    for c, r in results.items():
        if c.defence == me and c.report == "lie" and c.fraction in fractions:
            honest = results.get(Cell(me, c.attack, "honest", c.fraction))
            if honest is not None:
                d = paired_t(r.ba_ad, honest.ba_ad)
                if d.n:
                    diffs.append((d.mean, c, d))
    text = f"lie - honest BA AD <= {rule['lie_minus_honest']} (95 % intervals)"
    if diffs:
        mean, c, d = max(diffs, key=lambda x: x[0])
        out.append(Criterion(text, all_of([at_most(t, rule["lie_minus_honest"]) for _, _, t in diffs]),
                             f"largest at {c.attack}, f/n = {c.fraction}: {_t_text(d)}"))
    else:
        out.append(Criterion(text, None, "no lie/honest pair"))
    # 3. clean utility vs the reference defence, paired by seed: mine - ratio x reference >= 0
    mine_c, ref_c = results.get(Cell(me, CLEAN, "honest", 0.0)), results.get(Cell(ref, CLEAN, "honest", 0.0))
    noninferiority = clean_utility_test(grid) == "noninferiority"
    text = (noninferiority_text(rule["clean_utility_ratio"], ref) if noninferiority else
            f"clean utility >= {rule['clean_utility_ratio']} x {ref}'s (95 % interval of the paired difference)")
    have = bool(mine_c and ref_c and mine_c.utility and ref_c.utility)
    if have and noninferiority:
        out.append(Criterion(text, *noninferiority_detail(mine_c.utility, ref_c.utility, rule["clean_utility_ratio"],
                                                          me, ref)))
    elif have:
        a, b = float(np.mean(list(mine_c.utility.values()))), float(np.mean(list(ref_c.utility.values())))
        scaled = {s: rule["clean_utility_ratio"] * v for s, v in ref_c.utility.items()}
        d = paired_t(mine_c.utility, scaled)
        out.append(Criterion(text, at_least(d, 0.0), f"{a:.4f} vs {b:.4f} (ratio {a / b:.4f}); {me} - "
                             f"{rule['clean_utility_ratio']} x {ref} {_t_text(d)}"))
    else:
        out.append(Criterion(text, None, "clean runs missing"))
    # 4. ΔEOD vs clean, every attacked cell
    eods = [(t_test(list(r.delta_eod.values())), c) for c, r in results.items()
            if c.defence == me and c.attack != CLEAN and c.fraction in fractions and r.delta_eod]
    text = f"ΔEOD vs clean <= {rule['delta_eod']} (95 % intervals)"
    if eods:
        worst_eod, c = max(eods, key=lambda x: x[0].mean)
        out.append(Criterion(text, all_of([at_most(t, rule["delta_eod"]) for t, _ in eods]),
                             f"largest {_t_text(worst_eod)} at {c.attack}/{c.report}, f/n = {c.fraction}"))
    else:
        out.append(Criterion(text, None, "no EOD pair"))
    return out


def _t_text(t: TTest) -> str:
    return f"{interval_text(t, signed=True)} (n={t.n})"
