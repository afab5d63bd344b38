"""`resfl robustness`: the pre-registered Byzantine robustness grid (docs/robustness-protocol.md; the grid in
conf/table/robustness.yaml): defences x attacks x report modes x attacker fractions x seeds, each attacked run paired
with the same defence's clean run of the same seed. Per cell: BA AD (relative utility drop vs clean) with its
Student-t interval over seeds, utility, ΔEOD vs clean and the attackers' share of the aggregation weight; per defence
the worst case over attacks; the decision rule on resfl_robust; a figure of worst-case BA AD vs f/n.

Pure functions build the cells and read the numbers; RobustnessGrid declares the grid to analysis/execute.py, which
trains what is missing (resumable, a failed run never stops the others) and writes the markdown and the figure."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from resfl_lightning.analysis.execute import Context, Experiment, PlannedRun, Report, Runs, experiment_out
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.robustness_decision import (
    check_seeds_run,
    clean_utility_test,
    held_out_seeds,
    noninferiority_detail,
    noninferiority_text,
)
from resfl_lightning.analysis.run_data import RunData
from resfl_lightning.analysis.table import table_preset
from resfl_lightning.data.partition import count_from_fraction
from resfl_lightning.metrics.intervals import interval_text
from resfl_lightning.metrics.robustness import relative_drop
from resfl_lightning.metrics.statistics import TTest, no_positive_at_threshold, paired_t, t_test
from resfl_lightning.resources import conf_dir
from resfl_lightning.values import finite

CLEAN = "clean"


@dataclass(frozen=True)
class Cell:
    """One configuration of the grid, without its seed. The clean cell has attack 'clean', report 'honest', f 0."""

    defence: str
    attack: str
    report: str
    fraction: float

    @property
    def name(self) -> str:
        if self.attack == CLEAN:  # a clean cell told f > 0 (clean_reference: same_f) names its f/n
            return f"{self.defence}-clean" + (f"-f{round(100 * self.fraction):02d}" if self.fraction else "")
        return f"{self.defence}-{self.attack}-{self.report}-f{round(100 * self.fraction):02d}"


def grid_name(path: Path | None) -> str:
    """The grid file's name: `robustness` for the published grid (path None), else its own (robustness_v2)."""
    return "robustness" if path is None else Path(path).stem


def runs_kind(path: Path | None) -> str:
    """The first part of the grid's default run folders, runs/<kind>-...: a v2 grid's runs stay apart."""
    return grid_name(path).replace("_", "-")


def load_grid(path: Path | None = None) -> dict:
    return OmegaConf.to_container(OmegaConf.load(path or conf_dir() / "table" / "robustness.yaml"), resolve=True)


def select(grid: dict, subset: str | None) -> dict:
    """The grid restricted to a named subset (its fractions, attacks, report modes and defences), or with another
    number of clients n (`clients`: the protocol's n = 4, f = 1 cells), its own `seeds`, `overrides` of every run (a
    participation setting: the same in a cell's clean and attacked runs) or `decision` keys (merged into the grid's)."""
    check_attack_defences(grid)
    if subset is None:
        return grid
    subsets = grid.get("subsets", {})
    if subset not in subsets:
        raise ExperimentError(f"--subset {subset!r}: the grid file has {sorted(subsets)}")
    part = subsets[subset]
    out = dict(grid)
    out["clients"] = int(part.get("clients", grid["clients"]))
    out["fractions"] = list(part.get("fractions", grid["fractions"]))
    if any(count_from_fraction(out["clients"], f) < 1 for f in out["fractions"]):
        raise ExperimentError(f"subset {subset!r}: a fraction of {out['fractions']} gives no attacker among "
                              f"{out['clients']} clients")
    out["report_modes"] = list(part.get("report_modes", grid["report_modes"]))
    for key in ("attacks", "defences"):
        names = part.get(key, list(grid[key]))
        unknown = [n for n in names if n not in grid[key]]
        if unknown:
            raise ExperimentError(f"subset {subset!r}: unknown {key} {unknown}")
        out[key] = {n: grid[key][n] for n in names}
    out["seeds"] = int(part.get("seeds", grid["seeds"]))
    out["overrides"] = [*grid.get("overrides", []), *part.get("overrides", [])]
    out["decision"] = {**grid["decision"], **part.get("decision", {})}
    return out


def check_attack_defences(grid: dict) -> None:
    """An attack's `defences` (the only defences it runs against) must name defences of the grid."""
    for attack, spec in grid["attacks"].items():
        named = spec.get("defences") if isinstance(spec, dict) else None
        if named is not None and (unknown := [d for d in named if d not in grid["defences"]]):
            raise ExperimentError(f"attacks.{attack}.defences: unknown defences {unknown}")


def attacks_on(grid: dict, defence: str) -> list[str]:
    """The grid's attacks run against the defence: all, less those whose `defences` leave it out (an adaptive
    attack that reads one rule's parameters)."""
    return [a for a in grid["attacks"] if defence in attack_spec(grid, a).get("defences", [defence])]


def serves(grid: dict, defence: str, fraction: float) -> bool:
    """Whether the defence can run with the attackers of this f/n among the grid's n clients (Krum n >= 2f + 3,
    Bulyan 4f + 3)."""
    need = grid["defences"][defence].get("min_clients")
    return need is None or grid["clients"] >= need[0] * count_from_fraction(grid["clients"], fraction) + need[1]


def attack_spec(grid: dict, attack: str) -> dict:
    """{overrides, fraction_key, reports}: an attack given as a list of overrides uses the grid's Byzantine keys."""
    spec = grid["attacks"][attack]
    spec = {"overrides": spec} if isinstance(spec, list) else dict(spec)
    return {"fraction_key": grid["fraction_key"], "reports": True, **spec}


def reports_for(grid: dict, defence: str, attack: str) -> list[str]:
    """Report modes run for a (defence, attack): all for defences that read reports (no `sent` for omniscient
    attacks, which cannot evaluate what they send), else `honest` only (also for attacks without report modes)."""
    if defence not in grid["reads_reports"] or not attack_spec(grid, attack)["reports"]:
        return ["honest"]
    return [r for r in grid["report_modes"] if not (r == "sent" and attack in grid["omniscient"])]


# How an attacked cell finds its clean reference (grid key `clean_reference`): `shared`, the defence's one clean run
# told f = 0 (the published grids); `same_f`, for a defence told f, a clean run told the same f as the attacked run.
CLEAN_REFERENCES = ("shared", "same_f")


def clean_reference_mode(grid: dict) -> str:
    mode = grid.get("clean_reference", "shared")
    if mode not in CLEAN_REFERENCES:
        raise ExperimentError(f"conf/table/robustness.yaml clean_reference: {mode!r}; choose one of "
                              f"{', '.join(CLEAN_REFERENCES)}")
    return mode


def clean_of(grid: dict, cell: Cell) -> Cell:
    """The clean cell an attacked cell is paired with (a clean cell is its own): the defence's f = 0 clean cell, or
    with clean_reference: same_f the clean cell of the cell's f/n where that f changes the defence's overrides."""
    if cell.attack == CLEAN:
        return cell
    zero = Cell(cell.defence, CLEAN, "honest", 0.0)
    if clean_reference_mode(grid) == "shared" or defence_overrides(grid, cell.defence, cell.fraction) == \
            defence_overrides(grid, cell.defence, 0.0):
        return zero
    return Cell(cell.defence, CLEAN, "honest", cell.fraction)


def grid_cells(grid: dict) -> list[Cell]:
    """Every cell to train: each defence's clean cell, then per f/n it can serve its clean cell told that f (where
    clean_reference: same_f gives one) and its attacked cells."""
    cells = []
    for defence in grid["defences"]:
        cells.append(Cell(defence, CLEAN, "honest", 0.0))
        for fraction in grid["fractions"]:
            if not serves(grid, defence, fraction):
                continue
            attacked = [Cell(defence, attack, report, fraction)
                        for attack in attacks_on(grid, defence) for report in reports_for(grid, defence, attack)]
            cells += [c for c in dict.fromkeys(clean_of(grid, a) for a in attacked) if c not in cells]
            cells += attacked
    return cells


def defence_overrides(grid: dict, defence: str, fraction: float) -> list[str]:
    """The defence's overrides told the f of this f/n among the grid's clients ({f}, {trim_beta})."""
    n = grid["clients"]
    f = count_from_fraction(n, fraction)
    values = {"f": f, "trim_beta": max(f / n, 0.1)}
    return [o.format(**values) for o in grid["defences"][defence]["overrides"]]


def cell_overrides(grid: dict, cell: Cell) -> list[str]:
    """The Hydra overrides of a cell (without seed, dataset or run_dir): defence, attack, fraction, report."""
    n, run = grid["clients"], grid.get("overrides", [])  # `run`: a subset's participation, in every cell alike
    defence = defence_overrides(grid, cell.defence, cell.fraction)
    if cell.attack == CLEAN:
        return [*defence, *grid["clean"], f"dataset.num_clients={n}", *run]
    spec = attack_spec(grid, cell.attack)
    report = [f"{grid['report_key']}={cell.report}"] if spec["reports"] else []
    return [*defence, *spec["overrides"], f"{spec['fraction_key']}={cell.fraction}", *report,
            f"dataset.num_clients={n}", *run]


def run_dir_for(out: Path, cell: Cell, seed: int) -> Path:
    return out / f"{cell.name}-s{seed}"


def pinned_overrides(grid: dict, dataset: str, cell: Cell) -> list[str]:
    """The settings the grid pins for the cell's algorithm on `dataset` (grid `pinned`: the tuned settings its runs
    were made with, so that a later tune does not move its cells); [] where it pins none."""
    algorithms = [o.split("=", 1)[1] for o in grid["defences"][cell.defence]["overrides"] if o.startswith("algorithm=")]
    pins = (grid.get("pinned") or {}).get(dataset) or {}
    return [o for a in algorithms for o in pins.get(a, [])]


def train_overrides(dataset: str, scenario: str, grid: dict, cell: Cell, seed: int, out: Path,
                    overrides: list[str], run_dir: Path | None = None) -> list[str]:
    """The Hydra overrides of one run of the cell; it lives in run_dir_for(out, cell, seed) unless `run_dir` says."""
    rd = run_dir_for(out, cell, seed) if run_dir is None else run_dir
    return [f"dataset={dataset}", f"scenario={scenario}", *table_preset(dataset, overrides),
            *cell_overrides(grid, cell),
            *pinned_overrides(grid, dataset, cell), f"seed={seed}", f"run_dir={rd}", "logger=none", "progress=false",
            *overrides]


# ---- pairing: an attacked run differs from its clean reference only in the attack --------------------------------


def assumed_f_keys(grid: dict, defence: str) -> set[str]:
    """The config keys through which the defence is told f (its overrides with a {f} or {trim_beta} field): the one
    setting besides the attack in which an attacked run may differ from its clean run (none with clean_reference:
    same_f, where the clean run is told the same f)."""
    if clean_reference_mode(grid) == "same_f":
        return set()
    return {o.split("=", 1)[0] for o in grid["defences"][defence]["overrides"] if "{" in o}


def pair_mismatch(clean: dict, attacked: dict, assumed_f: set[str]) -> list[str]:
    """The settings other than the attack, the assumed f and where the run lives in which an attacked run's config
    differs from its clean reference's ('key: clean -> attacked'; [] when they pair)."""
    from resfl_lightning.analysis.run_settings import LOCATION_KEYS, TRANSFER_KEYS, legacy_aware_diff

    def allowed(key: str) -> bool:
        return (key == "attack" or key.startswith("attack.") or key in assumed_f or key in TRANSFER_KEYS
                or key.split(".", 1)[0] in LOCATION_KEYS)

    # A key added between the two runs' trainings pairs when the later run holds its legacy value (ADDED_KEYS).
    return [line for line in legacy_aware_diff(clean, attacked, both_ways=True) if not allowed(line.split(":", 1)[0])]


def unpaired_cells(grid: dict, cells: list[Cell], composed) -> list[str]:
    """Plan-time check: for each attacked cell, what its composed config (composed(cell) on the first seed) changes
    beyond the attack against its defence's clean cell."""
    out = []
    references: dict[Cell, dict] = {}  # each clean config, composed once
    for cell in cells:
        if cell.attack == CLEAN:
            continue
        clean = clean_of(grid, cell)
        if clean not in references:
            references[clean] = composed(clean)
        diff = pair_mismatch(references[clean], composed(cell), assumed_f_keys(grid, cell.defence))
        if diff:
            out.append(f"{cell.name}: " + "; ".join(diff[:4]))
    return out


def unpaired_runs(grid: dict, cells: list[Cell], seeds: list[int], out: Path) -> list[str]:
    """Read-time check: the finished attacked runs whose saved config (what they were trained with) differs from
    their clean run's beyond the attack; one line each."""
    import yaml

    def saved(cell: Cell, seed: int) -> dict | None:
        run_dir = run_dir_for(out, cell, seed)
        if not (run_dir / "summary.json").is_file() or not (run_dir / "config.yaml").is_file():
            return None  # unfinished, or saved no config to compare (as the stale-run check treats it)
        return yaml.load((run_dir / "config.yaml").read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))

    lines = []
    for s in seeds:
        references: dict[Cell, dict | None] = {}
        for cell in cells:
            if cell.attack == CLEAN:
                continue
            reference = clean_of(grid, cell)
            if reference not in references:
                references[reference] = saved(reference, s)
            clean, mine = references[reference], saved(cell, s)
            if clean is None or mine is None:
                continue
            diff = pair_mismatch(clean, mine, assumed_f_keys(grid, cell.defence))
            if diff:
                lines.append(f"{run_dir_for(out, cell, s).name}: " + "; ".join(diff[:4]))
    return lines


# ---- reading finished runs -------------------------------------------------------------------------------------


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


# ---- the decision rule -----------------------------------------------------------------------------------------


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


def harm_gate(results: dict[Cell, CellResult], grid: dict) -> str | None:
    """Why criterion 1 is undecidable on this dataset (None: it is decidable, or the grid sets no
    decision.baseline_harm): no attack at f/n = max_fraction drives the baseline's worst case to BA AD >= the bar or
    to the floor (the BA AD of a model at the majority-class accuracy / mAP 0), so a defence cannot be shown to
    remove harm that the attacks do not do."""
    rule = grid["decision"]
    bar = rule.get("baseline_harm")
    decided = [f for f in grid["fractions"] if f <= rule["max_fraction"] + 1e-9]
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
    fractions = [f for f in grid["fractions"] if f <= rule["max_fraction"] + 1e-9]
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


# ---- the markdown and the figure -------------------------------------------------------------------------------


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
    lines += ["", f"## Decision rule on {rule['defence']} (pre-registered, docs/robustness-protocol.md)", "",
              "Each criterion is decided on 95 % Student-t intervals over seeds: passed when every interval it reads "
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
    lines += weight_share_lines(results, grid, n)
    lines += root_ratio_lines(results, grid)
    return "\n".join(lines) + "\n"


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
    """Where the grid sets decision.weight_share_margin: per f/n <= max_fraction, the decision defence's attacked
    cell with the largest mean attackers' weight share against the bar f/n + margin, and every cell whose mean is
    above it (a report beside the rule, not a criterion); [] without the key (the published files)."""
    rule = grid["decision"]
    margin = rule.get("weight_share_margin")
    if margin is None:
        return []
    me = rule["defence"]
    lines = ["", f"## Attackers' share of {me}'s aggregation weight (bar: f/n + {margin})", "",
             "| f/n | bar | largest mean share (cell) | cells above the bar |", "| ---: | ---: | --- | --- |"]
    for f in [f for f in grid["fractions"] if f <= rule["max_fraction"] + 1e-9]:
        cells = [(float(np.mean(list(r.weight_share.values()))), c, r) for c, r in results.items()
                 if c.defence == me and c.attack != CLEAN and c.fraction == f and r.weight_share]
        bar = f + margin
        if not cells:
            lines.append(f"| {f} | {bar:.2f} | n/a | n/a |")
            continue
        mean, cell, r = max(cells, key=lambda x: x[0])
        above = ", ".join(f"{c.attack}/{c.report} {m:.3f}" for m, c, _ in sorted(cells, key=lambda x: -x[0])
                          if m > bar) or "none"
        lines.append(f"| {f} | {bar:.2f} | {_mean_text(r.weight_share, n)} ({cell.attack}/{cell.report}) | {above} |")
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


class RobustnessGrid(Experiment):
    """The grid of conf/table/robustness.yaml (ctx.options: `subset`, `seeds`): every cell's runs, each attacked
    run checked to differ from its clean run only in the attack and the assumed f (planned and trained), then
    robustness.md (BA AD per cell, worst cases, the decision rule) and robustness.png."""

    writer = "resfl robustness"
    keep = {"metrics.jsonl": ("round", WEIGHT_SHARE, ROOT_RATIO)}  # what run_values reads beyond the summary

    def grid(self, ctx: Context) -> dict:
        return select(load_grid(self.grid_path), ctx.options.get("subset"))

    def seeds(self, ctx: Context, grid: dict) -> list[int]:
        n = ctx.options.get("seeds")
        seeds = list(range(grid["seeds"] if n is None else n))
        check_seeds_run(grid, seeds)
        clean_utility_test(grid)  # a misspelt option fails before any run, not at the report
        return seeds

    @property
    def name(self) -> str:
        return grid_name(self.grid_path)

    def default_out(self, ctx: Context) -> Path:
        subset = ctx.options.get("subset")
        return experiment_out(runs_kind(self.grid_path), ctx, *([subset] if subset else []))

    def plan(self, ctx: Context, out: Path) -> list[PlannedRun]:
        grid = self.grid(ctx)
        return [PlannedRun(run_dir_for(out, c, s).name,
                           train_overrides(ctx.dataset, ctx.scenario, grid, c, s, out, ctx.overrides))
                for s in self.seeds(ctx, grid) for c in grid_cells(grid)]

    def unpaired_plan(self, ctx: Context, out: Path, planned: list[PlannedRun]) -> list[str]:
        from resfl_lightning.analysis.run_settings import composed_settings

        grid = self.grid(ctx)
        first = self.seeds(ctx, grid)[0]
        return unpaired_cells(grid, grid_cells(grid), lambda c: composed_settings(
            train_overrides(ctx.dataset, ctx.scenario, grid, c, first, out, ctx.overrides)))

    def unpaired_runs(self, ctx: Context, runs: Runs) -> list[str]:
        grid = self.grid(ctx)
        return unpaired_runs(grid, grid_cells(grid), self.seeds(ctx, grid), runs.out)

    def report(self, ctx: Context, runs: Runs) -> Report:
        grid = self.grid(ctx)
        seeds, cells, subset = self.seeds(ctx, grid), grid_cells(grid), ctx.options.get("subset")
        values = {(c, s): run_values(runs.get(run_dir_for(runs.out, c, s).name)) for s in seeds for c in cells}
        results = cell_results(values, cells, seeds, grid)
        grid_name = "" if self.name == "robustness" else f" (grid conf/table/{self.name}.yaml)"
        part = f"{grid_name}, subset {subset!r} of the pre-registered grid" if subset else grid_name
        title = (f"# Byzantine robustness, {ctx.dataset}, scenario {ctx.scenario}{part}: {len(cells)} cells x "
                 f"{len(seeds)} seeds ({len(runs.planned)} runs; {len(runs.failures)} failed; this invocation took "
                 f"{runs.elapsed_s:.0f} s with --jobs {ctx.jobs}; the runs' own wall times sum to "
                 f"{runs.runs_wall_s:.0f} s)")
        held = held_out_seeds(grid)
        caption = (f"{ctx.dataset}, {ctx.scenario}{f', subset {subset}' if subset else ''}: worst case over attacks "
                   f"and report modes, mean and 95 % t-interval over seeds {seeds[0]}-{seeds[-1]}" if held is None
                   else f"{ctx.dataset}, {ctx.scenario}{f', subset {subset}' if subset else ''}: worst case over "
                   f"attacks and report modes {held.text()}, mean and 95 % t-interval")
        nothing = [run_dir_for(runs.out, c, s).name for (c, s), v in values.items() if v["nothing_detected"]]
        body = markdown(results, grid, title, seeds, nothing) + "\n![worst-case BA AD vs f/n](robustness.png)\n"
        return Report(body, "robustness.md", {"robustness.png": lambda path: figure(results, grid, path, caption)})
