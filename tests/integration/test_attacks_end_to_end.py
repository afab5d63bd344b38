"""End to end through the real entry point: attack=privacy, attack=byzantine and attack=poisoning, and the paired
comparison against a clean run (subprocesses, femto model, 2 rounds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "YOLO_OFFLINE": "1"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("attack_runs")


def train(workdir: Path, name: str, *overrides: str) -> dict:
    run_dir = workdir / name
    cmd = [sys.executable, "-m", "resfl_lightning.train", "logger=none", "progress=false", "model.scale=femto",
           "dataset.num_images=120", "federation.rounds=2", "dataset.reserve_fraction=0.25",
           "dataset.extra_reserve_images=0",
           # tau 0.05: a 2-round femto model has detections above it, so TPR / FPR (and EOD) are not all zero
           "ufm.score_threshold=0.05",
           f"dataset.cache_dir={workdir / 'cache'}", f"run_dir={run_dir}", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


def run_compare(workdir: Path, clean: str, other: str) -> tuple[dict, str]:
    cmd = [sys.executable, "-m", "resfl_lightning", "compare", str(workdir / clean), str(workdir / other)]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((workdir / other / "comparison.json").read_text()), proc.stdout


@pytest.fixture(scope="module")
def clean(workdir) -> dict:
    return train(workdir, "clean", "attack=clean")


def test_privacy_run_reports_attacks_and_scores_without_changing_training(workdir, clean):
    s = train(workdir, "privacy", "attack=privacy")
    for key in ("attack/mia_success_rate", "attack/mia_auc", "attack/mia_tpr_at_fpr_1", "attack/mia_tpr_at_fpr_5",
                "attack/mia_tpr_at_fpr_10", "attack/mia_oracle_tpr_at_fpr_10", "attack/mia_threshold",
                "attack/aia_balanced_accuracy", "attack/aia_top1", "attack/aia_macro_f1", "attack/aia_chance_majority",
                "attack/aia_chance_uniform",
                "score/privacy"):
        assert key in s and 0.0 <= s[key] <= 1.0, key
    assert s["score/privacy"] == pytest.approx((s["attack/mia_success_rate"] + s["attack/aia_balanced_accuracy"]) / 2)
    assert s["attack/mia_n_members"] == s["attack/mia_n_nonmembers"] == 10  # 30 reserve images cut in thirds
    assert s["attack/update_aia_n_samples"] == 8  # 4 clients x 2 rounds
    assert s["attack/update_aia_applicable"] == 0.0  # IID shards: one dominant group, reported not applicable
    details = json.loads((workdir / "privacy" / "attacks" / "privacy_round_0001.json").read_text())
    assert details["mia"]["shadow_rounds"] == 2 and details["aia"]["n_samples"] == s["attack/aia_n_samples"]
    # The attacks are passive: the federated training is bit-for-bit the clean run's.
    assert s["test/map"] == clean["test/map"] and s["test/loss"] == clean["test/loss"]
    assert s["test/eod"] == clean["test/eod"]


def test_byzantine_run_and_ba_ad(workdir, clean):
    s = train(workdir, "byzantine", "attack=byzantine", "attack.byzantine.fraction=0.5", "attack.byzantine.gamma=4")
    assert s["attack/byzantine_num_attackers"] == 2
    assert s["test/loss"] != clean["test/loss"]
    result, stdout = run_compare(workdir, "clean", "byzantine")
    expected = (clean["test/map"] - s["test/map"]) / clean["test/map"]
    assert result["metrics"]["ba_ad"]["value"] == pytest.approx(expected)
    assert result["warnings"] == [] and "ba_ad" in stdout


def test_poisoning_run_and_dpa_eodd(workdir, clean):
    s = train(workdir, "poisoning", "attack=poisoning", "attack.poisoning.fraction=0.5")
    assert s["attack/poisoning_num_clients"] == 2 and s["attack/poisoning_boxes"] > 0
    assert s["test/loss"] != clean["test/loss"]  # the poisoned annotations reached training
    for run in (clean, s):
        assert run["test/eod_protected_group"] == 2
        assert run["test/eod_tpr_protected"] == pytest.approx(run["test/tpr/2"])  # same matching as the evaluation
        assert run["test/eod"] == pytest.approx(abs(run["test/eod_tpr_protected"] - run["test/eod_tpr_unprotected"])
                                                + abs(run["test/eod_fpr_protected"] - run["test/eod_fpr_unprotected"]))
        assert run["test/eod_fpr_protected"] + run["test/eod_fpr_unprotected"] > 0  # not a trivial 0 - 0
    result, stdout = run_compare(workdir, "clean", "poisoning")
    assert result["metrics"]["dpa_eodd"]["value"] == pytest.approx(s["test/eod"] - clean["test/eod"])
    assert "dpa_eodd" in stdout
