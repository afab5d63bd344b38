"""The DP-SGD accounting below a comparison table (analysis/dp_accounting.py, table.dp_section), fabricated runs."""

from __future__ import annotations

import json
from pathlib import Path

from resfl_lightning.analysis.dp_accounting import dp_accounting_lines
from resfl_lightning.analysis.statistics import SeedRecord, failed_record
from resfl_lightning.analysis.table import dp_section, run_dir_for


def fake_run(run_dir: Path, dp: dict | None) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps({"test/accuracy": 0.8, **(dp or {})}))
    (run_dir / "config.yaml").write_text("dataset:\n  task: classification\n")
    return run_dir


def dp(z: float, steps: float = 250.0, nsr: float = 0.3, spent: float | None = 0.99,
       target: float | None = 1.0) -> dict:
    out = {"dp/noise_multiplier": z, "dp/sample_rate": 0.04, "dp/steps": steps, "dp/max_grad_norm": 1.0,
           "dp/delta": 1e-6, "dp/epsilon_max": spent, "dp/nsr": nsr}
    return out if target is None else {**out, "dp/target_epsilon": target}


def test_rows_for_the_dp_methods_only(tmp_path: Path):
    runs = {
        "fedavg": [fake_run(tmp_path / "fedavg-s0", None)],
        "fedavg_dp": [fake_run(tmp_path / "fedavg_dp-s0", dp(2.5, steps=250.0, nsr=0.3, spent=0.98)),
                      fake_run(tmp_path / "fedavg_dp-s1", dp(2.5, steps=240.0, nsr=0.5, spent=0.99)),
                      tmp_path / "fedavg_dp-s2"],  # not finished: no summary.json
        "pfu_fl": [fake_run(tmp_path / "pfu_fl-s0", dp(0.0, nsr=0.0, spent=None, target=None))],
    }
    lines = dp_accounting_lines(runs)
    rows = lines[lines.index("| method | n | ε target | z | q | S_k | C | δ | spent ε | NSR |") + 2:]
    # steps differ across seeds: their range; spent epsilon: the largest; NSR: the mean (0.3 + 0.5) / 2
    assert rows == ["| fedavg_dp | 2 | 1 | 2.5 | 0.04 | 240–250 | 1 | 1e-06 | 0.990 | 0.4 |",
                    "| pfu_fl | 1 | — | 0 | 0.04 | 250 | 1 | 1e-06 | ∞ | 0 |"]  # no noise: no finite epsilon
    assert lines[0] == "" and lines[1].startswith("DP-SGD accounting")


def test_no_section_without_a_dp_run(tmp_path: Path):
    assert dp_accounting_lines({"fedavg": [fake_run(tmp_path / "fedavg-s0", None)], "resfl": []}) == []


def test_the_table_section_leaves_failed_seeds_out(tmp_path: Path):
    fake_run(run_dir_for(tmp_path, "fedavg_dp", 0), dp(2.0, nsr=0.2))
    fake_run(run_dir_for(tmp_path, "fedavg_dp", 1), dp(3.0, nsr=0.6))  # its run failed on a later attempt
    records = {"fedavg_dp": {0: SeedRecord(), 1: failed_record("exit 1")}}
    rows = [line for line in dp_section(tmp_path, {"fedavg_dp": [0, 1]}, records) if line.startswith("| fedavg_dp")]
    assert rows == ["| fedavg_dp | 1 | 1 | 2 | 0.04 | 250 | 1 | 1e-06 | 0.990 | 0.2 |"]
