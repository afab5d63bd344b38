"""The real entry point on a tiny config: outputs, DEVICES=2 == DEVICES=1, interrupt + resume == uninterrupted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TINY = ["logger=csv", "progress=false", "model.scale=femto", "dataset.num_images=64", "dataset.num_clients=2",
        "dataset.batch_size=8", "federation.rounds=2", "eval.every=1", "optim.lr=0.01"]


def train(run_dir: Path, *overrides: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    cmd = [sys.executable, "-m", "resfl_lightning.train", *TINY, f"run_dir={run_dir}", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        tail = f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    return proc


def final_theta(run_dir: Path) -> torch.Tensor:
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["theta"]


def final_states(run_dir: Path) -> dict[str, torch.Tensor]:
    """The global model, the SWA model and every client's own state (phi, power-iteration vector, UFM EMA)."""
    ckpt = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    out = {"theta": ckpt["theta"], **{f"extra/{k}": v for k, v in ckpt.get("extra", {}).items()}}
    if ckpt.get("swa") is not None:
        out["swa"] = ckpt["swa"]
    for path in sorted((run_dir / "checkpoints" / "clients").glob("client_*.pt")):
        latest = max(torch.load(path, weights_only=True)["versions"], key=lambda v: v["round"])
        out.update({f"{path.stem}/{k}": v for k, v in latest["state"].items()})
    return out


def assert_same_states(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], exact: bool) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]) or (a[k].isnan().all() and b[k].isnan().all()), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, equal_nan=True, msg=k)


# Every algorithm with client-local state: RESFL (phi, UFM EMA), CurvFed (power-iteration vector, SAM, best epoch,
# SWA) and RESFL with the curvature term on.
ALGORITHMS = {
    "resfl": [],
    "curvfed": ["algorithm=curvfed", "algorithm.swa_start=0", "algorithm.swa_every=1", "federation.local_epochs=2"],
    "resfl_curv": ["algorithm.lambda_curv=0.1"],
    "fairfed": ["algorithm=fairfed"],  # server weights carried across rounds in the checkpoint
    # A gather-all rule: 3 clients on 2 ranks (2 + 1) gathered and stacked in client order on both.
    "median": ["aggregation=median", "dataset.num_clients=3"],
}


@pytest.fixture(scope="module", params=list(ALGORITHMS))
def algorithm(request) -> list[str]:
    return ALGORITHMS[request.param]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, algorithm) -> Path:
    run_dir = tmp_path_factory.mktemp("e2e") / "baseline"
    train(run_dir, *algorithm)
    return run_dir


@pytest.mark.slow
def test_run_writes_metrics_checkpoints_and_summary(baseline: Path):
    rows = [json.loads(line) for line in (baseline / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    for key in ("test/map", "test/map_50", "test/delta_eop", "client/0/u", "client/1/weight", "time/train"):
        assert key in rows[-1], key
    weights = [v for k, v in rows[-1].items() if k.startswith("client/") and k.endswith("/weight")]
    assert sum(weights) == pytest.approx(1.0)
    summary = json.loads((baseline / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and "test/map_50" in summary
    assert (baseline / "config.yaml").read_text().count("lambda_priv") == 1
    assert (baseline / "csv").is_dir()
    ckpt = torch.load(baseline / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["round_idx"] == 1 and ckpt["theta"].dtype == torch.float32


@pytest.mark.slow
def test_two_processes_match_one(baseline: Path, algorithm: list[str], tmp_path: Path):
    train(tmp_path / "two", "fabric.devices=2", *algorithm)
    assert_same_states(final_states(tmp_path / "two"), final_states(baseline), exact=False)


@pytest.mark.slow
def test_interrupt_and_resume_equals_uninterrupted(baseline: Path, algorithm: list[str], tmp_path: Path):
    run_dir = tmp_path / "crashy"
    crashed = train(run_dir, "debug.crash_after_round=0", *algorithm, check=False)
    assert crashed.returncode != 0 and "simulated crash after round 0" in crashed.stderr
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["round_idx"] == 0
    train(run_dir, "resume=true", *algorithm)
    assert_same_states(final_states(run_dir), final_states(baseline), exact=True)
    rounds = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rounds == [0, 1]


@pytest.mark.slow
def test_devices_cores_uses_the_machines_cores_and_matches_one_process(baseline: Path, algorithm: list[str],
                                                                         tmp_path: Path):
    if algorithm != ALGORITHMS["resfl"]:
        pytest.skip("one algorithm suffices: the layout does not depend on the method")
    from resfl_lightning.federation.cpu_layout import usable_cores

    proc = train(tmp_path / "cores", "fabric.devices=cores", *algorithm)
    processes = min(usable_cores(), 2)  # TINY has 2 clients
    assert (f"MEMBER: 1/{processes}" in proc.stdout + proc.stderr) == (processes > 1)
    assert_same_states(final_states(tmp_path / "cores"), final_states(baseline), exact=False)
