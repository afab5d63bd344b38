"""The robustness grid's `clean_reference` (issue 57 item 5): `shared` (the default, the published grids) pairs every
attacked run with its defence's one clean run told f = 0; `same_f` pairs a defence told f with a clean run told the
same f."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.robustness_grid import (
    CLEAN,
    Cell,
    cell_overrides,
    clean_of,
    grid_cells,
    load_grid,
    select,
    train_overrides,
)
from resfl_lightning.analysis.robustness_pairing import unpaired_cells, unpaired_runs
from resfl_lightning.analysis.robustness_report import markdown
from resfl_lightning.analysis.robustness_results import cell_results


def same_f(grid: dict) -> dict:
    return {**grid, "clean_reference": "same_f"}


def test_the_published_grid_keeps_the_shared_clean_reference():
    grid = load_grid()
    assert grid["clean_reference"] == "shared"
    legacy = {k: v for k, v in grid.items() if k != "clean_reference"}  # a grid file written before the key
    cells = grid_cells(grid)
    assert cells == grid_cells(legacy) and sum(c.attack == CLEAN for c in cells) == len(grid["defences"])
    assert all(clean_of(grid, c) == Cell(c.defence, CLEAN, "honest", 0.0) for c in cells)
    assert [c.name for c in cells] == [c.name for c in grid_cells(legacy)]


def test_same_f_adds_a_clean_cell_per_assumed_f_where_f_changes_the_defence():
    grid = same_f(load_grid())
    cells = grid_cells(grid)
    clean = {(c.defence, c.fraction) for c in cells if c.attack == CLEAN}
    assert {f for d, f in clean if d == "krum"} == {0.0, 0.1, 0.2, 0.3}  # Krum serves f/n <= 0.3 among 10
    assert {f for d, f in clean if d == "bulyan"} == {0.0, 0.1}
    # trimmed mean is told max(f/n, 0.1): at f/n 0.1 that is the f = 0 clean run's 0.1, which serves both
    assert {f for d, f in clean if d == "trimmed_mean"} == {0.0, 0.2, 0.3, 0.4}
    assert clean_of(grid, Cell("trimmed_mean", "alie", "honest", 0.1)) == Cell("trimmed_mean", CLEAN, "honest", 0.0)
    assert {f for d, f in clean if d in ("fedavg", "median", "resfl_robust")} == {0.0}  # told no f
    krum20 = Cell("krum", CLEAN, "honest", 0.2)
    assert clean_of(grid, Cell("krum", "ipm", "honest", 0.2)) == krum20 and krum20.name == "krum-clean-f20"
    overrides = cell_overrides(grid, krum20)
    assert "aggregation.f=2" in overrides and "attack.byzantine.fraction=0.0" in overrides
    assert len(set(cells)) == len(cells) and cells.index(krum20) < cells.index(Cell("krum", "ipm", "honest", 0.2))
    with pytest.raises(ExperimentError, match="clean_reference: 'f0'"):
        grid_cells({**grid, "clean_reference": "f0"})


def test_same_f_pairs_ba_ad_with_the_clean_run_told_the_same_f():
    grid = same_f(select(load_grid(), "core"))
    utilities = {Cell("krum", CLEAN, "honest", 0.0): 0.80, Cell("krum", CLEAN, "honest", 0.2): 0.70,
                 Cell("krum", "ipm", "honest", 0.2): 0.63, Cell("fedavg", CLEAN, "honest", 0.0): 0.80,
                 Cell("fedavg", "ipm", "honest", 0.2): 0.60}
    grid["defences"] = {d: load_grid()["defences"][d] for d in ("fedavg", "krum")}
    values = {(c, 0): {"utility": u, "eod": 0.0, "weight_share": 0.1} for c, u in utilities.items()}
    cells = list(utilities)
    paired = cell_results(values, cells, [0], grid)
    assert paired[Cell("krum", "ipm", "honest", 0.2)].ba_ad[0] == pytest.approx(0.1)  # (0.70 - 0.63) / 0.70
    assert paired[Cell("fedavg", "ipm", "honest", 0.2)].ba_ad[0] == pytest.approx(0.25)
    shared = cell_results(values, cells, [0], {**grid, "clean_reference": "shared"})
    assert shared[Cell("krum", "ipm", "honest", 0.2)].ba_ad[0] == pytest.approx(0.2125)  # (0.80 - 0.63) / 0.80
    assert cell_results(values, cells, [0])[Cell("krum", "ipm", "honest", 0.2)].ba_ad == \
        shared[Cell("krum", "ipm", "honest", 0.2)].ba_ad
    text = markdown(paired, grid, "# t", [0])
    assert "| krum, told f = 2 (f/n = 0.2) | 0.700 |" in text and "of the same seed told the same f." in text
    assert "told the same f" not in markdown(shared, {**grid, "clean_reference": "shared"}, "# t", [0])


def test_same_f_refuses_a_pair_told_another_f(tmp_path: Path):
    import yaml

    grid = same_f(select(load_grid(), "core"))
    grid["defences"] = {"krum": load_grid()["defences"]["krum"]}
    cells = grid_cells(grid)

    def write(cell: Cell, f: int) -> None:
        run = tmp_path / f"{cell.name}-s0"
        run.mkdir(parents=True, exist_ok=True)
        (run / "summary.json").write_text(json.dumps({"test/accuracy": 0.8}))
        (run / "config.yaml").write_text(yaml.safe_dump({"aggregation": {"f": f}, "attack": {"name": cell.attack}}))

    for cell in cells:
        write(cell, round(cell.fraction * 10))
    assert unpaired_runs(grid, cells, [0], tmp_path) == []
    write(Cell("krum", CLEAN, "honest", 0.2), 0)  # a clean reference told another f than its attacked runs
    lines = unpaired_runs(grid, cells, [0], tmp_path)
    assert lines and all("-f20-s0" in line and "aggregation.f: 0 -> 2" in line for line in lines)


def test_every_attacked_cell_composes_to_its_same_f_clean_run_but_the_attack():
    from resfl_lightning.analysis.run_settings import composed_settings

    grid = same_f(select(load_grid(), "core"))
    grid["defences"] = {d: load_grid()["defences"][d] for d in ("trimmed_mean", "krum")}
    grid["attacks"], grid["report_modes"] = {"ipm": grid["attacks"]["ipm"]}, ["honest"]
    assert unpaired_cells(grid, grid_cells(grid), lambda c: composed_settings(
        train_overrides("adult", "iid", grid, c, 0, Path("runs/x"), []))) == []
