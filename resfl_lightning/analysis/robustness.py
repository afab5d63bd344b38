"""`resfl robustness`: the pre-registered Byzantine robustness grid (docs/robustness-protocol.md; the grid in
conf/table/robustness.yaml): defences x attacks x report modes x attacker fractions x seeds, each attacked run paired
with the same defence's clean run of the same seed. Per cell: BA AD (relative utility drop vs clean) with its
Student-t interval over seeds, utility, ΔEOD vs clean and the attackers' share of the aggregation weight; per defence
the worst case over attacks; the decision rule on resfl_robust; a figure of worst-case BA AD vs f/n.

RobustnessGrid declares the grid to analysis/execute.py, which trains what is missing (resumable, a failed run never
stops the others) and writes the markdown and the figure. Its pure parts: the cells and their overrides
(robustness_grid.py), the pairing checks (robustness_pairing.py), the runs' numbers per cell (robustness_results.py),
the decision rule (robustness_criteria.py, with its held-out options in robustness_decision.py), the file and the
figure (robustness_report.py)."""

from __future__ import annotations

from pathlib import Path

from resfl_lightning.analysis.execute import Context, Experiment, PlannedRun, Report, Runs, experiment_out
from resfl_lightning.analysis.robustness_decision import check_seeds_run, clean_utility_test, held_out_seeds
from resfl_lightning.analysis.robustness_grid import (
    grid_cells,
    grid_name,
    load_grid,
    run_dir_for,
    runs_kind,
    select,
    train_overrides,
)
from resfl_lightning.analysis.robustness_pairing import unpaired_cells, unpaired_runs
from resfl_lightning.analysis.robustness_report import figure, markdown
from resfl_lightning.analysis.robustness_results import ROOT_RATIO, WEIGHT_SHARE, cell_results, run_values


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
