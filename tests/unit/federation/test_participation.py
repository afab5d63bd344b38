"""Partial participation: a seeded sample per round, independent of world size, dealt evenly to ranks;
only sampled clients train, are weighted and update their own state."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from resfl_lightning.federation.participation import deal, sample_clients, sample_size
from tests.federation_helpers import run_federation


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31), round_idx=st.integers(0, 500), n=st.integers(1, 2000),
       spec=st.one_of(st.none(), st.integers(1, 2000), st.floats(1e-4, 1.0)), world=st.integers(1, 16))
def test_sample_is_a_function_of_seed_and_round_and_ranks_stay_balanced(seed, round_idx, n, spec, world):
    if isinstance(spec, int) and spec > n:
        spec = n
    clients = sample_clients(seed, round_idx, n, spec)
    k = n if spec is None else spec if isinstance(spec, int) else max(1, min(n, math.floor(spec * n + 0.5)))
    assert len(clients) == len(set(clients)) == k and clients == sorted(clients)
    assert all(0 <= c < n for c in clients)
    assert clients == sample_clients(seed, round_idx, n, spec)  # deterministic, whatever the world size
    shares = [deal(clients, r, world) for r in range(world)]
    assert sorted(c for share in shares for c in share) == clients  # every sampled client on exactly one rank
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_full_participation_keeps_the_fixed_dealing_rule():
    assert sample_clients(0, 3, 7, None) == sample_clients(0, 3, 7, 1.0) == list(range(7))
    assert deal(list(range(7)), 1, 3) == [i for i in range(7) if i % 3 == 1]


def test_samples_vary_by_round_and_cover_every_client():
    seen = [sample_clients(5, r, 100, 10) for r in range(200)]
    assert len({tuple(s) for s in seen}) > 190
    counts = torch.bincount(torch.tensor([c for s in seen for c in s]), minlength=100)
    assert counts.min() > 0 and abs(counts.float().mean().item() - 20.0) < 1e-9  # 200 rounds x 10 / 100


@pytest.mark.parametrize("bad", [0, 11, -0.5, 0.0, 1.5, math.nan, True, "10"])
def test_bad_sample_sizes_name_the_key(bad):
    with pytest.raises(ValueError, match="federation.clients_per_round"):
        sample_size(bad, 10)


def test_only_sampled_clients_train_and_update_their_state(tmp_path):
    fed, state, rec = run_federation(tmp_path, num_clients=6, rounds=3, clients_per_round=0.5)
    for r, metrics in enumerate(rec.metrics):
        sampled = sample_clients(0, r, 6, 0.5)
        assert len(sampled) == 3
        trained = sorted(i for (rr, i) in rec.deltas if rr == r)
        assert trained == sampled
        assert sorted(int(k.split("/")[1]) for k in metrics if k.startswith("client/")) == sampled
        # FedAvg weights over the sampled set only (hand-computed from the deltas the clients sent)
        before = rec.initial if r == 0 else rec.thetas[r - 1]
        sizes = {i: fed.data.num_train(i) for i in sampled}
        mean = sum(rec.deltas[(r, i)].double() * sizes[i] / sum(sizes.values()) for i in sampled)
        torch.testing.assert_close(rec.thetas[r], (before.double() + mean).float())
    # a client's stored state was written in the last round it was sampled, and never otherwise
    fed.client_states.commit()
    for i in range(6):
        rounds = [r for r in range(3) if i in sample_clients(0, r, 6, 0.5)]
        path = fed.client_states.path(i)
        if not rounds:
            assert not path.exists()
            continue
        versions = torch.load(path, weights_only=True)["versions"]
        assert max(v["round"] for v in versions) == max(rounds)


def test_sampled_run_resumes_like_an_uninterrupted_one(tmp_path):
    from resfl_lightning.federation.orchestrator import SimulatedCrash

    _, full, _ = run_federation(tmp_path / "full", num_clients=5, rounds=3, clients_per_round=2)
    with pytest.raises(SimulatedCrash):
        run_federation(tmp_path / "crash", num_clients=5, rounds=3, clients_per_round=2, crash_after_round=0)
    _, resumed, _ = run_federation(tmp_path / "crash", num_clients=5, rounds=3, clients_per_round=2, resume=True)
    assert torch.equal(resumed.theta, full.theta)


def test_bench_scale_run_keeps_state_only_for_sampled_clients():
    """The `make bench` virtual-client run: 200 clients at 5 %: only the 2 x 10 sampled clients get a state file."""
    from resfl_lightning.benchmarks.scale import child

    out = child(200, 0.05, 2)
    ever = {c for r in range(2) for c in sample_clients(0, r, 200, 0.05)}
    assert out["sampled"] == 10 and out["states_on_disk"] == len(ever)
    assert out["steps"] > 0 and out["peak_rss_mb"] > 0
