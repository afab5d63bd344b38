"""The client-count check of a robustness subset (analysis/client_check.py): the amendment's rule on hand-made
numbers, the runs it composes, and a results file that says whether the configured n agrees with the rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resfl_lightning import cli
from resfl_lightning.analysis.client_check import ClientCheck, check_rule, decide_clients
from resfl_lightning.analysis.execute import Context, execute
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.robustness_grid import load_grid

RULE = {"seed": 123, "clients": [4, 5, 10], "metric": "val/map_50", "reference": 4, "candidate": 5, "fallback": 4,
        "min_ratio": 0.5}


def test_the_candidate_is_chosen_when_it_reaches_half_the_reference():
    # the amendment's own numbers (docs/robustness-protocol.md): 0.455 >= 0.5 x 0.501
    assert decide_clients({4: 0.501, 5: 0.455, 10: 1e-5}, RULE).clients == 5
    assert decide_clients({4: 0.5, 5: 0.25}, RULE).clients == 5  # the bar itself passes (>=)
    assert decide_clients({4: 0.501, 5: 0.2}, RULE).clients == 4
    assert decide_clients({4: 0.501, 5: None}, RULE).clients is None


def test_the_detection_subset_declares_the_amendments_rule_on_a_seed_outside_the_grid():
    grid = load_grid()
    rule = check_rule(grid, "detection")
    assert rule == RULE
    assert rule["seed"] not in range(grid["seeds"])
    with pytest.raises(ExperimentError, match="has no client_check"):
        check_rule(grid, "core")
    grid["subsets"]["detection"]["client_check"] = {**RULE, "candidate": 6}
    with pytest.raises(ExperimentError, match="candidate 6 is not among clients"):
        check_rule(grid, "detection")
    grid["subsets"]["detection"]["client_check"] = {**RULE, "metric": "test/map_50"}
    with pytest.raises(ExperimentError, match="'test/map_50' is not a validation key"):
        check_rule(grid, "detection")


def _fake_runs(values: dict[int, float], seen: list):
    """run_jobs that 'trains' each check run by writing the summary its n should give (val/* only where the run
    evaluates the final model on the validation splits, as the trainer does)."""
    def run_jobs(jobs, workers, **_):
        for run_dir, overrides in jobs:
            seen.append(overrides)
            n = int(next(o for o in overrides if o.startswith("dataset.num_clients=")).split("=")[1])
            run_dir.mkdir(parents=True, exist_ok=True)
            summary = {"test/map_50": values[n] * 1.1, "test/map": values[n] / 2}
            if "eval.final_validation=true" in overrides:
                summary["val/map_50"] = values[n]
            (run_dir / "summary.json").write_text(json.dumps(summary))
            (run_dir / "table_wall_s.json").write_text(json.dumps({"wall_s": 1.0}))
        return []
    return run_jobs


def test_the_check_trains_fedavg_clean_at_each_n_and_records_the_outcome(tmp_path, monkeypatch):
    seen: list = []
    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs", _fake_runs({4: 0.501, 5: 0.455, 10: 1e-5}, seen))
    results = tmp_path / "check.md"
    check = ClientCheck()
    execute(check, Context("synthetic", "group_skew", [], 1, "resfl robustness --check-clients", tmp_path / "o",
                           results, {"subset": "detection"}))
    assert (check.outcome.clients, check.configured) == (5, 5)
    assert len(seen) == 3
    for n, overrides in zip([4, 5, 10], seen):
        assert {"algorithm=fedavg", "attack.byzantine.fraction=0.0", f"dataset.num_clients={n}", "seed=123",
                "experiment=table_synthetic"} <= set(overrides)
        assert sum(o.startswith("run_dir=") for o in overrides) == 1
    assert len({o for ov in seen for o in ov if o.startswith("run_dir=")}) == 3  # one folder per n
    text = results.read_text()
    assert "- command: `resfl robustness --check-clients`" in text
    assert "| 5 | 0.455 | 0.2275 | 0.908 |" in text
    assert "**agrees**" in text


def test_the_cli_exits_1_when_the_configured_n_disagrees_with_the_rule(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs", _fake_runs({4: 0.501, 5: 0.2, 10: 1e-5}, []))
    code = cli.main(["robustness", "--dataset", "synthetic", "--scenario", "group_skew", "--subset", "detection",
                     "--check-clients", "--jobs", "1", "--out", str(tmp_path / "o")])
    assert code == 1
    assert "DISAGREES (the rule picks 4)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--check-clients needs --subset"):
        cli.main(["robustness", "--check-clients", "--out", str(Path(tmp_path) / "p")])


def test_the_v2_check_evaluates_on_validation_and_decides(tmp_path, monkeypatch):
    """The v2 grid's check reads val/map_50: its runs evaluate the final model on the validation splits (before
    eval.final_validation was composed, the key never existed and the check could only say 'not decidable')."""
    from resfl_lightning.resources import conf_dir

    seen: list = []
    monkeypatch.setattr("resfl_lightning.analysis.runner.run_jobs", _fake_runs({4: 0.6, 5: 0.5, 10: 0.0}, seen))
    check = ClientCheck(conf_dir() / "table" / "robustness_v2.yaml")
    execute(check, Context("synthetic", "group_skew", [], 1, "resfl robustness --check-clients", tmp_path / "o",
                           tmp_path / "check.md", {"subset": "detection"}))
    assert all("eval.final_validation=true" in overrides for overrides in seen) and len(seen) == 3
    assert (check.outcome.clients, check.configured) == (5, 5)
    assert "| 5 | 0.5 | 0.25 | 0.833 |" in (tmp_path / "check.md").read_text()
