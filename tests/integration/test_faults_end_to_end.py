"""Fault tolerance and partial participation on the real entry point, 1 and 2 processes (gloo): client faults are
survived, a sampled round leaves a rank idle without breaking the collectives, and a killed rank stops the run with a
message and resumes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.integration.test_train_end_to_end import assert_same_states, final_states, train

FAULT = ['debug.fail_clients=["1:0:raise"]']


def rounds(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("faults") / "baseline"
    train(run_dir)
    return run_dir


@pytest.fixture(scope="module")
def faulty_one(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run_dir = tmp_path_factory.mktemp("faults") / "faulty_one"
    return run_dir, train(run_dir, *FAULT)


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 2])
def test_a_failing_client_is_dropped_on_one_and_two_processes(devices, faulty_one, tmp_path):
    """On 2 processes client 1 is rank 1's only client: that rank contributes nothing in round 0."""
    run_dir, proc = faulty_one if devices == 1 else (tmp_path / "two", train(tmp_path / "two", "fabric.devices=2",
                                                                                *FAULT))
    assert "client 1, round 0: dropped from aggregation: InjectedFault" in proc.stderr
    r0, r1 = rounds(run_dir)
    assert (r0["client/1/dropped"], r0["client/0/dropped"], r0["round/aggregated"], r0["round/skipped"]) == \
        (1.0, 0.0, 1.0, 0.0)
    assert r0["client/0/weight"] == pytest.approx(1.0) and "client/1/weight" not in r0
    assert (r1["client/1/dropped"], r1["round/aggregated"]) == (0.0, 2.0)
    assert_same_states(final_states(run_dir), final_states(faulty_one[0]), exact=False)


@pytest.mark.slow
def test_sampled_rounds_leave_a_rank_idle_and_match_one_process(tmp_path):
    args = ["dataset.num_clients=3", "federation.clients_per_round=1"]
    train(tmp_path / "one", *args)
    train(tmp_path / "two", "fabric.devices=2", *args)
    assert_same_states(final_states(tmp_path / "two"), final_states(tmp_path / "one"), exact=False)
    for row in rounds(tmp_path / "two"):
        assert row["round/sampled"] == row["round/aggregated"] == 1.0
        assert sum(k.endswith("/dropped") and k.startswith("client/") for k in row) == 1


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 0])
def test_killed_rank_stops_the_run_with_a_message_and_resume_continues(rank, baseline, tmp_path):
    run_dir = tmp_path / "killed"
    t0 = time.perf_counter()
    try:
        crashed = train(run_dir, "fabric.devices=2", "fabric.timeout_s=120", f"debug.kill_rank={rank}",
                        "debug.kill_round=1", check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("a run with a killed rank hung")
    elapsed = time.perf_counter() - t0
    assert crashed.returncode != 0
    if rank == 1:  # the launching process (rank 0) watches its child ranks
        assert "rank 1 (pid" in crashed.stderr and "exited with code -9 during round 1" in crashed.stderr
    else:  # the surviving child notices at its next collective
        assert "rank 1: report all_gather in round 1 failed: rank 0" in crashed.stderr
    assert "The checkpoint of the last completed round (0) is intact" in crashed.stderr
    assert elapsed < 400
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["round_idx"] == 0
    train(run_dir, "fabric.devices=2", "resume=true")
    assert [r["round"] for r in rounds(run_dir)] == [0, 1]
    assert_same_states(final_states(run_dir), final_states(baseline), exact=False)
