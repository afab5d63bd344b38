"""The Byzantine robustness grid's cells (docs/robustness-protocol.md; conf/table/robustness.yaml and
robustness_v2.yaml): which (defence, attack, report mode, f/n) cells a grid or subset trains, the clean cell each
attacked cell is paired with, and the Hydra overrides and run folder of each run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.table import table_preset
from resfl_lightning.data.partition import count_from_fraction
from resfl_lightning.resources import conf_dir

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
