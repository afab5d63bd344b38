"""`resfl dp-curve` (analysis/dp_curve.py): the pre-registered grid and its errors, each point's overrides, and the
markdown / figure built from fabricated per-run values (no training)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from resfl_lightning.analysis import dp_curve
from resfl_lightning.analysis.dp_accounting import DP_KEYS, run_values
from resfl_lightning.analysis.dp_curve import (
    CurvePoint,
    DpCurve,
    ExperimentError,
    curve_markdown,
    curve_points,
    load_grid,
    plot_curve,
    row_cells,
    summarise,
)
from resfl_lightning.analysis.execute import Context, execute
from resfl_lightning.analysis.run_data import finished_run
from tests.helpers import compose_config

GOOD = """methods: [fedavg_dp, pfu_fl]
epsilon: [1, inf]
ablations: {fedavg: [algorithm=fedavg]}
seeds: [0, 1, 2]
attack: none
confidence: 0.95
"""


def test_the_registered_grid():
    grid = load_grid()
    assert grid.methods == ["fedavg_dp", "puffle", "pfu_fl"]
    assert grid.epsilons == [0.5, 1.0, 2.0, 8.0, math.inf]
    assert set(grid.ablations) == {"fedavg", "fedavg_gn"} and grid.seeds == [0, 1, 2] and grid.attack == "none"
    assert len(curve_points(grid)) == 3 * 5 + 2
    assert grid.source == "conf/table/dp_curve.yaml"


@pytest.mark.parametrize(("change", "key"), [
    (("seeds: [0, 1, 2]\n", ""), "seeds: missing"),
    (("[fedavg_dp, pfu_fl]", "[fedavg_dp, nosuch]"), "methods[1]: no preset"),
    (("[fedavg_dp, pfu_fl]", "[fedavg]"), "methods[0]: fedavg is no DP-SGD preset"),
    (("[1, inf]", "[1, -2]"), "epsilon[1]: expected a positive number or inf"),
    (("[1, inf]", "[1, 1.0]"), "epsilon: values repeat"),
    (("[1, inf]", "[]"), "epsilon: expected a non-empty list"),
    (("[algorithm=fedavg]", "[fedavg]"), "ablations.fedavg: expected a non-empty list of key=value"),
    (("{fedavg:", "{pfu_fl:"), "ablations.pfu_fl: a label"),
    (("[0, 1, 2]", "[0, 0]"), "seeds: expected a non-empty list of distinct integers"),
    (("attack: none", "attack: nosuch"), "attack: expected a conf/attack/ preset"),
    (("confidence: 0.95", "confidence: 95"), "confidence: expected a number in (0, 1)"),
])
def test_grid_errors_name_the_file_and_key(tmp_path: Path, change, key):
    path = tmp_path / "grid.yaml"
    path.write_text(GOOD.replace(*change))
    with pytest.raises(ExperimentError) as err:
        load_grid(path)
    assert str(err.value).startswith(f"{path}: ") and key in str(err.value)


def test_points_compose_to_the_intended_dp_settings():
    grid = load_grid()
    inf = CurvePoint("pfu_fl", math.inf).overrides(grid)
    assert inf == ["algorithm=pfu_fl", "algorithm.dp.target_epsilon=null", "algorithm.dp.noise_multiplier=0.0"]
    cfg = compose_config(*CurvePoint("pfu_fl", 0.5).overrides(grid), "logger=none")
    assert (cfg.algorithm.dp.target_epsilon, cfg.algorithm.dp.noise_multiplier) == (0.5, None)
    cfg = compose_config(*CurvePoint("puffle", math.inf).overrides(grid), "logger=none")
    assert (cfg.algorithm.dp.target_epsilon, cfg.algorithm.dp.noise_multiplier) == (None, 0.0)
    cfg = compose_config(*CurvePoint("fedavg_gn").overrides(grid), "logger=none")
    assert cfg.algorithm.dp.enabled is False and cfg.algorithm.name == "fedavg_gn"
    assert CurvePoint("puffle", 8.0).dir_name(2) == "puffle-eps8-s2"
    assert CurvePoint("fedavg_dp", math.inf).dir_name(0) == "fedavg_dp-epsinf-s0"
    assert CurvePoint("fedavg").dir_name(1) == "fedavg-s1"


def dp_run(utility: float, z: float = 2.5, nsr: float = 0.4, spent: float | None = 0.99, steps: float = 250.0) -> dict:
    return {"utility": utility, "z": z, "q": 0.0397, "steps": steps, "C": 1.0, "delta": 1e-6,
            "epsilon_spent": spent, "nsr": nsr, "task": "classification"}


def test_row_cells_from_fabricated_runs():
    utilities = [0.80, 0.82, 0.81]
    row = summarise(CurvePoint("fedavg_dp", 1.0), {s: dp_run(u, nsr=0.3 + 0.1 * s, spent=0.98 + 0.005 * s)
                                                   for s, u in enumerate(utilities)}, 0.95)
    ci = stats.t.interval(0.95, 2, loc=0.81, scale=stats.sem(utilities))
    assert row_cells(row) == ["1", "3", f"0.8100 [{ci[0]:.4f}, {ci[1]:.4f}]", "3/3", "2.5", "0.0397", "250", "1",
                              "1e-06", "0.990", "0.4"]
    differing = summarise(CurvePoint("puffle", 1.0), {0: dp_run(0.7, steps=250.0), 1: dp_run(0.7, steps=240.0)}, 0.95)
    assert row_cells(differing)[6] == "240–250"
    clip = summarise(CurvePoint("pfu_fl", math.inf), {0: dp_run(0.84, z=0.0, nsr=0.0, spent=math.inf)}, 0.95)
    assert row_cells(clip)[:3] == ["∞ (clipping only)", "1", "0.8400"] and row_cells(clip)[-2:] == ["∞", "0"]
    none = {"utility": 0.85, "task": "classification", **{k: None for k in DP_KEYS}}
    ablation = summarise(CurvePoint("fedavg"), {0: none, 1: dict(none, utility=0.86)}, 0.95)
    assert row_cells(ablation)[0] == "no DP" and row_cells(ablation)[4:] == ["—"] * 7


def fake_run(run_dir: Path, utility: float, z: float | None, task: str = "classification") -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = {"test/accuracy": utility, "dp/noise_multiplier": z, "dp/sample_rate": 0.04, "dp/steps": 250.0,
               "dp/max_grad_norm": 1.0, "dp/delta": 1e-6, "dp/epsilon_max": None if z == 0 else 0.99,
               "dp/nsr": 0.0 if z == 0 else 0.5}
    if z is None:
        summary = {"test/accuracy": utility}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "config.yaml").write_text(f"dataset:\n  task: {task}\n")
    (run_dir / "table_wall_s.json").write_text(json.dumps({"wall_s": 2.0}))


def test_run_values_reads_the_summary_and_marks_no_noise_as_infinite_epsilon(tmp_path: Path):
    fake_run(tmp_path / "a", 0.8, 0.0)
    values = run_values(finished_run(tmp_path / "a"))
    assert values["epsilon_spent"] == math.inf and values["z"] == 0.0 and values["utility"] == 0.8
    fake_run(tmp_path / "b", 0.8, None)
    assert run_values(finished_run(tmp_path / "b"))["z"] is None
    assert run_values(finished_run(tmp_path / "missing")) is None


def test_markdown_and_plot_from_fabricated_runs(tmp_path: Path, monkeypatch):
    """The whole command without training: run_jobs is replaced by one that writes each run's files."""
    grid_path = tmp_path / "grid.yaml"
    grid_path.write_text(GOOD)
    calls = []

    def fake_jobs(jobs, workers, **_):
        calls.append(len(jobs))
        for rd, overrides in jobs:
            seed = int(next(o for o in overrides if o.startswith("seed=")).split("=")[1])
            z = 0.0 if "algorithm.dp.noise_multiplier=0.0" in overrides else (None if "algorithm=fedavg" in overrides
                                                                               else 2.0)
            fake_run(rd, 0.80 + 0.01 * seed + (0.02 if z is None else 0.0), z)
        return []

    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs", fake_jobs)
    monkeypatch.setattr("resfl_lightning.analysis.run_settings.stale_runs", lambda jobs: [])
    out, results = tmp_path / "out", tmp_path / "results"
    ctx = Context("adult", "iid", ["dataset.root=/data/adult"], 1, "resfl dp-curve --dataset adult "
                  "dataset.root=/data/adult", out, results, {"grid": grid_path})
    execute(DpCurve(), ctx)
    text = (out / "dp-curve.md").read_text()
    assert text.startswith("# DP privacy-utility curve: adult, scenario iid (2 methods x 2 ε and 1 ablation x 3 "
                           "seeds = 15 runs)")
    assert "- command: `resfl dp-curve --dataset adult dataset.root=/data/adult`" in text and "- commit: " in text
    assert "| fedavg_dp | 1 | 3 | 0.8100 [" in text and "| pfu_fl | ∞ (clipping only) | 3 |" in text
    assert "| fedavg | no DP | 3 | 0.8300 [" in text
    # the grid passed with --grid is the one named (it said conf/table/dp_curve.yaml whatever was read)
    assert f"The grid, as pre-registered ({grid_path}):" in text
    assert "Ablations (no DP-SGD; overrides and comments in the grid above): fedavg." in text
    assert (out / "dp-curve.png").stat().st_size > 10_000
    assert (results / "out.png").is_file() and "](out.png)" in (results / "out.md").read_text()
    execute(DpCurve(), Context("adult", "iid", [], 1, "resfl dp-curve", out, None, {"grid": grid_path}))  # resumed
    assert calls == [15, 15] and len(list(out.glob("*-s*"))) == 15  # (the real run_jobs skips finished runs)


def test_a_grid_without_ablations_describes_none(tmp_path: Path):
    path = tmp_path / "grid.yaml"
    path.write_text(GOOD.replace("{fedavg: [algorithm=fedavg]}", "{}"))
    grid = load_grid(path)
    rows = [summarise(p, {0: dp_run(0.3)}, 0.95) for p in curve_points(grid)]
    text = curve_markdown(grid, "t", rows, "classification", [])
    assert len(rows) == 4 and "Ablations" not in text and "fedavg_gn" not in text


def test_plot_with_a_single_seed_and_detection(tmp_path: Path):
    grid = load_grid()
    rows = [summarise(p, {0: dict(dp_run(0.3), task="detection")}, 0.95) for p in curve_points(grid)]
    plot_curve(grid, rows, tmp_path / "c.png", "t", "detection")
    assert (tmp_path / "c.png").is_file()
    assert "test mAP@50" in curve_markdown(grid, "t", rows, "detection", ["run x failed"])


def test_methods_at_one_epsilon_are_drawn_apart_around_its_tick(tmp_path: Path, monkeypatch):
    """Three methods' intervals at the same ε covered each other; each method is now shifted by a constant factor on
    the log axis, symmetric about the ε tick, in its own colour and marker."""
    import matplotlib.pyplot as plt

    grid = load_grid()
    rows = [summarise(p, {s: dp_run(0.3 + 0.01 * s) for s in range(3)}, 0.95) for p in curve_points(grid)]
    drawn = {}
    monkeypatch.setattr(dp_curve, "save_figure", lambda fig, ax, title, path: (drawn.update(ax=ax), plt.close(fig)))
    plot_curve(grid, rows, tmp_path / "c.png", "t", "classification")
    lines = [c.lines[0] for c in drawn["ax"].containers]
    assert len(lines) == len(grid.methods) >= 2
    first = sorted(float(line.get_xdata()[0]) for line in lines)  # every method's point at the smallest ε
    smallest = min(e for e in grid.epsilons)
    assert len(set(first)) == len(lines) and np.isclose(np.exp(np.mean(np.log(first))), smallest)
    assert len({(line.get_color() if isinstance(line.get_color(), str) else tuple(line.get_color()),
                 line.get_marker()) for line in lines}) == len(lines)


def test_where_each_method_starts_to_learn(tmp_path: Path):
    """A method learns at ε when every finished seed is above the table's floor (detection mAP@50 >= 0.05); it starts
    to learn at the smallest ε from which it learns at every larger ε, so a lucky ε below a failing one does not
    count."""
    grid = load_grid()
    maps = {"fedavg_dp": {0.5: 0.01, 1: 0.02, 2: 0.2, 8: 0.3, math.inf: 0.4},   # from 2
            "puffle": {0.5: 0.01, 1: 0.2, 2: 0.03, 8: 0.3, math.inf: 0.4},      # 1 is lucky: from 8
            "pfu_fl": {e: 0.01 for e in grid.epsilons}}                          # never
    rows = []
    for method, per_eps in maps.items():
        for eps, m in per_eps.items():
            runs = {}
            for s in range(3):
                run_dir = tmp_path / f"{method}-{eps}-{s}"
                run_dir.mkdir()
                (run_dir / "summary.json").write_text(json.dumps({"test/map_50": m + 0.001 * s}))
                (run_dir / "config.yaml").write_text("dataset:\n  task: detection\n")
                runs[s] = run_values(finished_run(run_dir))
            rows.append(summarise(CurvePoint(method, eps), runs, 0.95))
    assert row_cells(rows[2])[3] == "3/3" and row_cells(rows[0])[3] == "0/3"
    assert [dp_curve.learns_from(grid, rows, m) for m in grid.methods] == [
        "fedavg_dp: learns from ε = 2 on", "puffle: learns from ε = 8 on", "pfu_fl: learns at no ε of the grid"]
    text = curve_markdown(grid, "t", rows, "detection", [])
    assert "- puffle: learns from ε = 8 on" in text and "| learned |" in text
    assert dp_curve.learns_from(grid, rows[:4], "fedavg_dp").endswith("not decidable (a target ε has no finished run)")


def test_the_calibrated_grid_runs_every_dp_method_at_one_declared_step():
    """conf/table/dp_curve_calibrated.yaml: the four DP rows at PFU-FL's tuned C and lr (method_overrides), epsilon
    after them; the ablations keep their own settings."""
    grid = load_grid(Path(__file__).resolve().parents[3] / "conf" / "table" / "dp_curve_calibrated.yaml")
    assert grid.methods == ["fedavg_dp", "puffle", "pfu_fl", "puffle_resfl"] and len(curve_points(grid)) == 4 * 5 + 2
    for method in grid.methods:
        cfg = compose_config(*CurvePoint(method, 1.0).overrides(grid), "experiment=table_synthetic", "use_tuned=false",
                             "logger=none")
        assert (cfg.algorithm.dp.max_grad_norm, cfg.optim.lr, cfg.algorithm.dp.target_epsilon) == (0.1, 3.0, 1.0)
    gn = compose_config(*CurvePoint("fedavg_gn").overrides(grid), "experiment=table_synthetic", "use_tuned=false",
                        "logger=none")
    assert gn.optim.lr == 0.01 and gn.algorithm.dp.enabled is False


def test_method_overrides_may_not_set_the_epsilon(tmp_path: Path):
    path = tmp_path / "grid.yaml"
    path.write_text(GOOD + "method_overrides: [algorithm.dp.noise_multiplier=1.0]\n")
    with pytest.raises(ExperimentError, match="method_overrides: the epsilon grid sets"):
        load_grid(path)
    path.write_text(GOOD + "method_overrides: [optim.lr]\n")
    with pytest.raises(ExperimentError, match="method_overrides: expected a list of key=value"):
        load_grid(path)


def test_clipping_only_rows_are_read_as_shares_of_each_reference_on_common_seeds():
    """Issue 53 reads each ε = ∞ row against the models without DP-SGD (≥ 0.5× FedAvg, ≥ 0.8× fedavg_gn): the curve
    prints mean over mean on the seeds both finished with its delta-method interval, checked here by hand."""
    grid = load_grid(Path(__file__).resolve().parents[3] / "conf" / "table" / "dp_curve_calibrated.yaml")
    clip = {0: 0.60, 1: 0.70, 2: 0.74}
    fedavg, gn = {0: 0.80, 1: 0.84, 2: 0.86}, {0: 0.75, 1: 0.70}  # fedavg_gn's seed 2 did not finish
    rows = [summarise(CurvePoint("fedavg_dp", math.inf), {s: dp_run(u, z=0.0) for s, u in clip.items()}, 0.95),
            summarise(CurvePoint("fedavg_dp", 8.0), {s: dp_run(0.01) for s in range(3)}, 0.95),
            summarise(CurvePoint("fedavg"), {s: dp_run(u) for s, u in fedavg.items()}, 0.95),
            summarise(CurvePoint("fedavg_gn"), {s: dp_run(u) for s, u in gn.items()}, 0.95)]
    lines = dp_curve.clipping_only_lines(grid, rows)
    assert lines[3] == "| method | / fedavg | / fedavg_gn |"
    assert len(lines) == 6  # the ε = 8 row is not a clipping-only row

    def by_hand(x, y):
        x, y = np.array(x), np.array(y)
        r = x.mean() / y.mean()
        half = stats.t.ppf(0.975, len(x) - 1) * ((x - r * y) / y.mean()).std(ddof=1) / math.sqrt(len(x))
        return f"{r:.3f} [{r - half:.3f}, {r + half:.3f}] (n={len(x)})"

    assert lines[5] == (f"| fedavg_dp | {by_hand([0.60, 0.70, 0.74], [0.80, 0.84, 0.86])} | "
                        f"{by_hand([0.60, 0.70], [0.75, 0.70])} |")
    assert lines[5].startswith("| fedavg_dp | 0.816 [")  # 0.68 / 0.8333
    assert dp_curve.clipping_only_lines(grid, rows[1:]) == []  # no ε = ∞ row: no section
    assert "Clipping only (ε = ∞) as a share" in curve_markdown(grid, "t", rows, "detection", [])
