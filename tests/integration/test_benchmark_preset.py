"""The calibrated detection benchmark (docs/benchmark.md) carries the paper's phenomena under FedAvg: one calibration
seed of `resfl experiment calibration`, its clean run and its sign-flip partner, against the card's floors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHANCE_3_GROUPS = 1 / 3


@pytest.mark.slow
def test_fedavg_on_the_calibrated_preset_clears_the_cards_floors(tmp_path):
    from resfl_lightning.analysis.calibration import BA_AD, Calibration
    from resfl_lightning.analysis.execute import Context
    from resfl_lightning.analysis.robustness_results import ba_ad, run_values
    from resfl_lightning.analysis.run_data import load_run

    experiment = Calibration()
    seed = experiment.card.seeds[0]
    planned = {r.name: r for r in experiment.plan(Context("synthetic", "group_skew", []), tmp_path)}
    env = {**os.environ, "WANDB_MODE": "offline", "YOLO_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    runs = {}
    for kind in ("clean", "sign_flip"):
        run = planned[f"{kind}-s{seed}"]
        proc = subprocess.run([sys.executable, "-m", "resfl_lightning.train", *run.overrides], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=1500)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[kind] = load_run(tmp_path / run.name)

    failures = []
    for p in experiment.card.phenomena:
        if p.key == BA_AD:
            value = ba_ad(run_values(runs["clean"])["utility"], run_values(runs["sign_flip"])["utility"])
        else:
            value = runs["clean"].value(p.key)
        assert value is not None, p.name
        if p.key == "attack/aia_balanced_accuracy":
            # The card's one shortfall (docs/benchmark.md, "Attribute leakage"): its above-chance claim is about the
            # seed mean; one run reads 0.39-0.58 on the 13 calibration seeds here and 0.26 for seed 200 on the CI
            # machine. So one run shows only that the probe read the detector's own matched persons (no ground-truth
            # fallback) across the reserve.
            assert 0.0 <= value <= 1.0, value
            assert runs["clean"].value("attack/aia_gt_box_fallback") == 0.0
            assert runs["clean"].value("attack/aia_n_matched") >= 300, runs["clean"].value("attack/aia_n_matched")
        elif p.at_least is not None and value < p.at_least:
            failures.append((p.name, value, p.at_least))
    assert not failures, failures
