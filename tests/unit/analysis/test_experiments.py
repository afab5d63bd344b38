"""What every experiment gets from the one pipeline (analysis/execute.py), checked for each registered one on a small
declaration of it: a finished run trained with other settings is refused before anything trains, a failed run fails
the command after its files are written, and a published file carries its provenance header and its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from resfl_lightning.analysis.client_check import ClientCheck
from resfl_lightning.analysis.execute import Context, execute, load_experiment, registered
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.run_settings import composed_settings
from tests.unit.analysis.test_frontier import TINY_GRID

TINY_ROBUSTNESS = """_target_: resfl_lightning.analysis.robustness.RobustnessGrid
clients: 10
seeds: 2
fractions: [0.2]
clean: [attack=byzantine, attack.byzantine.fraction=0.0]
attacks:
  sign_flip: [attack=byzantine]
omniscient: []
fraction_key: attack.byzantine.fraction
report_key: attack.byzantine.report
report_modes: [honest]
reads_reports: []
defences:
  fedavg: {overrides: [algorithm=fedavg]}
  krum: {overrides: [algorithm=fedavg, aggregation=krum, "aggregation.f={f}"], min_clients: [2, 3]}
decision: {defence: krum, baseline: fedavg, reference: fedavg, max_fraction: 0.2, worst_ba_ad: 0.15,
           margin_vs_baseline: 0.1, lie_minus_honest: 0.02, clean_utility_ratio: 0.98, delta_eod: 0.02}
"""

TINY_ROBUSTNESS_V2 = TINY_ROBUSTNESS.replace("  sign_flip: [attack=byzantine]\n", """  sign_flip: [attack=byzantine]
  adaptive_cap: {overrides: [attack=byzantine_adaptive_cap], defences: [resfl_robust], reports: false}
""").replace("  krum: {", "  resfl_robust: {overrides: [algorithm=resfl_robust]}\n  krum: {").replace(
    "seeds: 2\n", "seeds: 3\nclean_reference: same_f\n").replace(
    "delta_eod: 0.02}",
    "delta_eod: 0.02,\n           selection_seeds: [0], evaluation_seeds: [1, 2], baseline_harm: 0.5}")

TINY_CURVE = """_target_: resfl_lightning.analysis.dp_curve.DpCurve
methods: [fedavg_dp]
epsilon: [1]
ablations: {}
seeds: [0, 1]
attack: none
confidence: 0.95
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch):
    """An experiment's default paths are relative to the working directory (tune publishes its trial log to
    docs/results/ by default): run in tmp_path, so no test writes into the repository."""
    monkeypatch.chdir(tmp_path)


def _small(name: str, tmp_path: Path):
    """(experiment, context) of a small declaration of the registered experiment `name`."""
    if name.startswith("robustness"):  # robustness_v2: the published grid's class, with v2's keys
        grid = tmp_path / f"{name}.yaml"
        grid.write_text(TINY_ROBUSTNESS if name == "robustness" else TINY_ROBUSTNESS_V2)
        return load_experiment(grid), {}
    if name.startswith("dp_curve"):
        grid = tmp_path / "dp_curve.yaml"
        grid.write_text(TINY_CURVE)
        return load_experiment(grid), {}
    if name == "privacy":
        return load_experiment(registered()[name]), {"algorithms": ["fedavg"], "robustness": True}
    if name == "tune":
        return load_experiment(registered()[name]), {"methods": ["fedavg"], "trials": 1}
    if name == "adversary_frontier":
        grid = tmp_path / "frontier.yaml"
        grid.write_text(TINY_FRONTIER)
        return load_experiment(grid), {}
    if name == "calibration":
        grid = tmp_path / "calibration.yaml"
        grid.write_text(TINY_CALIBRATION)
        return load_experiment(grid), {}
    if name == "methods":
        return load_experiment(registered()[name]), {"methods": ["fedavg"], "seeds": 2, "primary_seeds": 2}
    raise KeyError(name)


TINY_CALIBRATION = """_target_: resfl_lightning.analysis.calibration.Calibration
method: fedavg
seeds: [0, 1]
check_seeds: [5]
clean: [attack=privacy, "attack.enabled=[mia,aia,eod]"]
attacked: [attack=byzantine]
fraction: 0.2
phenomena:
  group gap: {key: test/delta_eop, at_least: 0.15, sd_at_most: 0.05}
  attack sensitivity: {key: ba_ad, at_least: 0.5}
"""

TINY_FRONTIER = "_target_: resfl_lightning.analysis.frontier.Frontier\n" + TINY_GRID.replace(
    "tuning_seeds: [100]", "tuning_seeds: [100, 101]")  # two seeds: a paired interval

CASES = [*sorted(registered()), "client_check"]


def _case(name: str, tmp_path: Path, results: Path | None = None):
    if name == "client_check":
        experiment, options = ClientCheck(), {"subset": "detection"}
        dataset, scenario = "synthetic", "group_skew"
    else:
        experiment, options = _small(name, tmp_path)
        dataset, scenario = "adult", "iid"
    ctx = Context(dataset, scenario, [], 1, f"resfl {name}", tmp_path / "out", results, options)
    return experiment, ctx


def _train(jobs, skip: int = -1) -> list[str]:
    """Stand-in for the launcher: each run's files as a finished run leaves them (its composed config saved)."""
    failures = []
    for i, (run_dir, overrides) in enumerate(jobs):
        if i == skip:
            failures.append(f"run {run_dir} failed (1); see its log")
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(composed_settings(overrides))))
        (run_dir / "summary.json").write_text(json.dumps({"test/accuracy": 0.8 - 0.01 * i, "test/eod": 0.1,
                                                          "test/map": 0.3, "test/map_50": 0.5}))
        (run_dir / "metrics.jsonl").write_text(json.dumps({"round": 0, "test/accuracy": 0.8}) + "\n")
        (run_dir / "table_wall_s.json").write_text(json.dumps({"wall_s": 1.5, "commit": "a" * 40}))
    return failures


def test_every_registered_experiment_has_a_small_case(tmp_path: Path):
    for name in registered():
        assert _small(name, tmp_path)[0] is not None


@pytest.mark.parametrize("name", CASES)
def test_a_stale_finished_run_is_refused_before_training(name: str, tmp_path: Path, monkeypatch):
    experiment, ctx = _case(name, tmp_path)
    first = experiment.plan(ctx, ctx.out)[0]
    run_dir = ctx.out / first.name
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("seed: 99\n")
    (run_dir / "summary.json").write_text("{}")
    (run_dir / "table_wall_s.json").write_text(json.dumps({"wall_s": 1.0}))
    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs",
                        lambda jobs, workers, **_: pytest.fail("trained despite a stale run"))
    with pytest.raises(ExperimentError, match="trained with other settings"):
        execute(experiment, ctx)


@pytest.mark.parametrize("name", CASES)
def test_every_experiment_stops_on_a_stop_file_in_its_out_folder(name: str, tmp_path: Path, monkeypatch):
    """`touch <out>/STOP` reaches the launcher of every experiment command (analysis/runner.py reads it)."""
    experiment, ctx = _case(name, tmp_path)
    seen = []
    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs",
                        lambda jobs, workers, stop_file=None: seen.append(stop_file) or _train(jobs))
    execute(experiment, ctx)
    assert seen == [ctx.out / "STOP"]


@pytest.mark.parametrize("name", CASES)
def test_a_failed_run_fails_the_command_after_the_files_are_written(name: str, tmp_path: Path, monkeypatch):
    experiment, ctx = _case(name, tmp_path)
    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs", lambda jobs, workers, **_: _train(jobs, skip=0))
    with pytest.raises(ExperimentError, match="1 of .* runs failed"):
        execute(experiment, ctx)
    written = [p for p in ctx.out.glob("*.md")]
    assert written and all(p.read_text().startswith("# ") for p in written)


@pytest.mark.parametrize("name", CASES)
def test_the_published_file_has_its_provenance_and_figures(name: str, tmp_path: Path, monkeypatch):
    experiment, ctx = _case(name, tmp_path, results=tmp_path / "docs" / "published.md")
    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs", lambda jobs, workers, **_: _train(jobs))
    out, report = execute(experiment, ctx)
    text = (tmp_path / "docs" / "published.md").read_text()
    head = text.split("\n## ")[0]
    for line in ("- command: `resfl ", "- commit: ", "- packages: requirements.lock ", "- wall time: ",
                 "- runs trained at: aaaaaaaaaaaa ("):
        assert line in head, line
    assert "the runs' own wall times sum to" in head
    for name_, _ in report.figures.items():
        assert (out / name_).is_file()
    figures = sorted(p.name for p in (tmp_path / "docs").glob("*.png"))
    assert len(figures) == sum(f"]({name_})" in report.markdown for name_ in report.figures)
    for figure in figures:
        assert f"]({figure})" in text
