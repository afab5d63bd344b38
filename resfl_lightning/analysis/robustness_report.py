"""The robustness grid's results file and figure: BA AD per cell and f/n with the worst case per defence, the clean
runs, the decision rule's verdicts, the attackers' weight share and FLTrust's fidelity; worst-case BA AD against
f/n as a figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from resfl_lightning.analysis.robustness_criteria import decide, decided_fractions
from resfl_lightning.analysis.robustness_decision import HeldOut, clean_utility_test, held_out_seeds
from resfl_lightning.analysis.robustness_grid import CLEAN, Cell, attacks_on, clean_reference_mode, serves
from resfl_lightning.analysis.robustness_results import ROOT_RATIO_BAND, CellResult, worst_case
from resfl_lightning.data.partition import count_from_fraction
from resfl_lightning.metrics.intervals import interval_text
from resfl_lightning.metrics.statistics import t_test


def _mean_text(values: dict[int, float], planned: int, signed: bool = False) -> str:
    if not values:
        return "n/a"
    t = t_test(list(values.values()))
    return interval_text(t, signed=signed) + (f" (n={t.n})" if t.n < planned else "")


def _absent_text(grid: dict, defence: str, fraction: float, attack: str | None = None) -> str:
    """What a column shows for a cell the grid does not run, and why."""
    if not serves(grid, defence, fraction):
        return "n/a (not served)"
    if attack is not None and attack not in attacks_on(grid, defence):
        return "n/a (attacks another rule)"
    return "= honest"  # a column is shown when some defence runs it: here the defence reads no report


def _worst_text(results: dict[Cell, CellResult], grid: dict, defence: str, fraction: float, planned: int) -> str:
    w = worst_case(results, grid, defence, fraction)
    if w is not None:
        return f"{_mean_text(w.ba_ad, planned)} {w.cell.attack}/{w.cell.report}"
    return "n/a" if serves(grid, defence, fraction) else "n/a (not served)"


def _fraction_tables(results: dict[Cell, CellResult], grid: dict, f: float, n: int) -> list[str]:
    """The BA AD table of one f/n (with the worst-case column) and its utility / weight share / ΔEOD table."""
    defences = list(grid["defences"])
    columns = [(a, rep) for a in grid["attacks"] for rep in grid["report_modes"]
               if any(Cell(d, a, rep, f) in results for d in defences)]
    head = "| defence | " + " | ".join(f"{a} ({rep})" for a, rep in columns)
    lines = ["", f"## f/n = {f}: BA AD", "", head + " | worst case |", "| --- |" + " ---: |" * (len(columns) + 1)]
    for d in defences:
        row = [_mean_text(results[Cell(d, a, rep, f)].ba_ad, n) if Cell(d, a, rep, f) in results
               else _absent_text(grid, d, f, a) for a, rep in columns]
        lines.append(f"| {d} | " + " | ".join([*row, _worst_text(results, grid, d, f, n)]) + " |")
    lines += ["", f"f/n = {f}: utility under attack; attackers' share of the aggregation weight (mean over rounds); "
              "ΔEOD vs clean (EOD attacked - EOD clean: the DPA EODD in the poisoning and label-flip columns)", "",
              head + " |", "| --- |" + " ---: |" * len(columns)]
    for d in defences:
        row = []
        for a, rep in columns:
            r = results.get(Cell(d, a, rep, f))
            row.append(_absent_text(grid, d, f, a) if r is None else
                       f"{_mean_text(r.utility, n)}; {_mean_text(r.weight_share, n)}; "
                       f"{_mean_text(r.delta_eod, n, signed=True)}")
        lines.append(f"| {d} | " + " | ".join(row) + " |")
    return lines


def _run_overrides_text(grid: dict) -> str:
    run = grid.get("overrides", [])
    return f" (every run, clean and attacked: {', '.join(f'`{o}`' for o in run)})" if run else ""


def nothing_detected_lines(runs: list[str]) -> list[str]:
    """The note on the runs whose EOD is left out of ΔEOD (run_values: TPR 0 in every group at the threshold)."""
    if not runs:
        return []
    return ["", f"ΔEOD leaves out {len(runs)} runs that detect nothing at the operating threshold (TPR 0 in every "
            "group: their EOD is 0 - 0, which would read as a fairness gain of the attack): "
            + ", ".join(sorted(runs)) + "."]


def markdown(results: dict[Cell, CellResult], grid: dict, title: str, seeds: list[int],
             nothing_detected: list[str] = ()) -> str:
    n = len(seeds)
    same_f = clean_reference_mode(grid) == "same_f"
    lines = [title, "",
             f"n = {grid['clients']} clients{_run_overrides_text(grid)}, seeds {seeds[0]}-{seeds[-1]}; every attacked "
             "run is paired with the same "
             f"defence's clean run of the same seed{' told the same f' if same_f else ''}. BA AD = (clean - attacked) "
             "/ clean utility; mean [95 % Student-t "
             "interval over seeds]; n shown where below the seeds run; n/a: no run of the cell finished; n/a (not "
             "served): the rule cannot serve that f (Krum n < 2f + 3, Bulyan n < 4f + 3); = honest: the defence reads "
             "no report, so every report mode is its honest run. Omniscient attacks have no `sent` column: they "
             "cannot evaluate what they send.", ""]
    defences = list(grid["defences"])
    held = held_out_seeds(grid)
    lines += ["## Worst case over attacks and report modes", "",
              *([f"Each defence's worst cell per f/n is {held.text()} (decision.selection_seeds / evaluation_seeds): "
                 "the mean of the cell chosen is not the max of the means it was chosen by.", ""] if held else []),
              "| defence | " + " | ".join(f"f/n = {f}" for f in grid["fractions"]) + " |",
              "| --- |" + " ---: |" * len(grid["fractions"])]
    worst_n = len(held.evaluation) if held else n
    lines += [f"| {d} | " + " | ".join(_worst_text(results, grid, d, f, worst_n) for f in grid["fractions"]) + " |"
              for d in defences]
    lines += ["", "## Clean runs", "", "| defence | utility |", "| --- | ---: |"]
    for d in defences:
        r = results.get(Cell(d, CLEAN, "honest", 0.0))
        lines.append(f"| {d} | {_mean_text(r.utility, n) if r else 'n/a'} |")
        for c, r in results.items():  # clean cells told f > 0 (clean_reference: same_f)
            if c.defence == d and c.attack == CLEAN and c.fraction:
                f = count_from_fraction(grid["clients"], c.fraction)
                lines.append(f"| {d}, told f = {f} (f/n = {c.fraction}) | {_mean_text(r.utility, n)} |")
    for f in grid["fractions"]:
        lines += _fraction_tables(results, grid, f, n)
    lines += nothing_detected_lines(list(nothing_detected))
    rule = grid["decision"]
    lines += ["", f"## Decision rule on {rule['defence']} (pre-registered, docs/robustness-protocol.md)", ""]
    if held and not decided_fractions(grid):
        # a v2 coverage subset above the rule's f/n (`above`): its pairs exist, so "not decided" would mislead
        # (without the held-out keys the published n4 file renders as it was published)
        lines.append(f"This grid has no f/n at or below decision.max_fraction = {rule['max_fraction']}: the rule reads "
                     "none of its cells (reported, not deciding).")
    else:
        lines += _criteria_lines(results, grid, held)
    lines += weight_share_lines(results, grid, n)
    lines += root_ratio_lines(results, grid)
    return "\n".join(lines) + "\n"


def _criteria_lines(results: dict[Cell, CellResult], grid: dict, held: HeldOut | None) -> list[str]:
    """The decision rule's criteria, each with its verdict, and the held-out options it reads them with."""
    lines = ["Each criterion is decided on 95 % Student-t intervals over seeds: passed when every interval it reads "
             "lies on the right side of its bound, FAILED when one lies on the wrong side, not decided when one "
             "straddles it (more seeds would decide it).", ""]
    options = ([f"criterion 1 reads each defence's worst cell {held.text()}"] if held else []) + (
        ["criterion 3 is a one-sided non-inferiority t-test at alpha = 0.05 (passed when its lower 95 % bound is > 0, "
         "FAILED when its upper one is < 0)"] if clean_utility_test(grid) == "noninferiority" else [])
    if options:
        lines += ["Held-out decision options (docs/robustness-protocol.md, declared before the runs): "
                  + "; ".join(options) + ".", ""]
    for c in decide(results, grid):
        verdict = "not decided" if c.passed is None else ("passed" if c.passed else "FAILED")
        lines.append(f"- {c.text}: **{verdict}** — {c.detail}")
    return lines


def root_ratio_lines(results: dict[Cell, CellResult], grid: dict) -> list[str]:
    """Per defence whose runs log FLTrust's ||g_0|| / median ||d_i||: its range over rounds, cells and seeds, and the
    runs with a round outside the fidelity band (reported, not dropped); [] when no run logs it."""
    lo, hi = ROOT_RATIO_BAND
    lines = []
    for d in grid["defences"]:
        runs = [(c, s, span) for c, r in results.items() if c.defence == d for s, span in r.root_ratio.items()]
        if not runs:
            continue
        outside = [f"{c.name}-s{s}" for c, s, (a, b) in runs if a < lo or b > hi]
        lines.append(f"| {d} | {min(a for _, _, (a, _) in runs):.2f}-{max(b for _, _, (_, b) in runs):.2f} | "
                     f"{len(outside)} of {len(runs)}{': ' + ', '.join(outside[:8]) if outside else ''}"
                     f"{' ...' if len(outside) > 8 else ''} |")
    if not lines:
        return []
    return ["", f"## FLTrust fidelity: ||g_0|| / median ||d_i|| per round (faithful in [{lo}, {hi}])", "",
            "| defence | range over rounds, cells and seeds | runs with a round outside |", "| --- | ---: | --- |",
            *lines]


def weight_share_lines(results: dict[Cell, CellResult], grid: dict, n: int) -> list[str]:
    """Where the grid sets decision.weight_share_margin: per f/n, the decision defence's attacked cell with the
    largest mean attackers' weight share against the bar f/n + margin, and every cell whose mean is above it (a
    report beside the rule, not a criterion; an f/n above max_fraction is labelled so); [] without the key (the
    published files)."""
    rule = grid["decision"]
    margin = rule.get("weight_share_margin")
    if margin is None:
        return []
    me = rule["defence"]
    lines = ["", f"## Attackers' share of {me}'s aggregation weight (bar: f/n + {margin})", "",
             "| f/n | bar | largest mean share (cell) | cells above the bar |", "| ---: | ---: | --- | --- |"]
    decided = decided_fractions(grid)
    for f in grid["fractions"]:
        label = f if f in decided else f"{f} (above the rule's {rule['max_fraction']})"
        cells = [(float(np.mean(list(r.weight_share.values()))), c, r) for c, r in results.items()
                 if c.defence == me and c.attack != CLEAN and c.fraction == f and r.weight_share]
        bar = f + margin
        if not cells:
            lines.append(f"| {label} | {bar:.2f} | n/a | n/a |")
            continue
        mean, cell, r = max(cells, key=lambda x: x[0])
        above = ", ".join(f"{c.attack}/{c.report} {m:.3f}" for m, c, _ in sorted(cells, key=lambda x: -x[0])
                          if m > bar) or "none"
        lines.append(f"| {label} | {bar:.2f} | {_mean_text(r.weight_share, n)} ({cell.attack}/{cell.report}) | "
                     f"{above} |")
    return lines


def figure_axes(results: dict[Cell, CellResult], grid: dict, title: str = ""):
    """(fig, ax) of worst-case BA AD (over attacks and report modes) against f/n, one line per defence with its
    t-interval; each defence its own colour and marker, the decision rule's defence (in black) and baseline drawn
    heavier. A grid of one f/n (the n4 subset) puts the defences side by side along x instead, since on an f/n
    axis they would all sit on one point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from resfl_lightning.analysis.figures import series_style, set_title

    rule = grid["decision"]
    single = len(grid["fractions"]) == 1
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    drawn: list[str] = []
    for i, d in enumerate(grid["defences"]):
        xs, ys, lo, hi = [], [], [], []
        for f in grid["fractions"]:
            w = worst_case(results, grid, d, f)
            if w is None or not w.ba_ad:
                continue
            t = t_test(list(w.ba_ad.values()))
            xs.append(len(drawn) if single else f)
            ys.append(t.mean)
            lo.append(t.mean - t.low if t.n >= 2 else 0.0)
            hi.append(t.high - t.mean if t.n >= 2 else 0.0)
        if xs:
            drawn.append(d)
            key = d in (rule["defence"], rule["baseline"])
            style = series_style(i) | ({"color": "black"} if d == rule["defence"] else {})  # black: in no cycle
            ax.errorbar(xs, ys, yerr=[lo, hi], capsize=3, label=d, linewidth=2.2 if key else 1.0,
                        markersize=6 if key else 4, **style)
    if single:
        ax.set_xticks(range(len(drawn)), drawn, rotation=30, ha="right", fontsize=8)
        ax.set_xlabel(f"defence (attacker fraction f/n = {grid['fractions'][0]:g})")
    else:
        ax.set_xlabel("attacker fraction f/n")
    ax.set_ylabel("worst-case BA AD (relative utility drop)")
    ax.axhline(rule["worst_ba_ad"], color="grey", linestyle=":", linewidth=1,
               label=f"decision bound {rule['worst_ba_ad']}")
    if title:
        set_title(ax, title)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig, ax


def figure(results: dict[Cell, CellResult], grid: dict, path: Path, title: str = "") -> Path:
    """figure_axes saved to `path`."""
    import matplotlib.pyplot as plt

    fig, _ = figure_axes(results, grid, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
