"""10,000 virtual clients on one process (docs/performance.md): a round's cost is O(sampled clients). Each property is
checked by counting calls (no timing): a round reads and writes only its sampled clients' loaders, sizes and stored
states, and the client-state store's byte count does not re-sum the states it holds on every put."""

from __future__ import annotations

from collections import defaultdict
from unittest import mock

import lightning as L
import pytest
import torch

from resfl_lightning.aggregation.fedavg import FedAvg
from resfl_lightning.federation import client_state
from resfl_lightning.federation.client_state import ClientStateStore, state_bytes
from resfl_lightning.federation.orchestrator import Federation, FederationSettings
from resfl_lightning.federation.participation import sample_clients
from tests.federation_helpers import client_factory, tiny_data

NUM_CLIENTS, SAMPLED = 10_000, 4


def _recording(obj, name: str, calls: dict[str, list[int]]) -> None:
    """Wrap obj.<name>(client_id, ...) so every call's client id is recorded under `name`."""
    original = getattr(obj, name)

    def wrapper(client_id, *args, **kwargs):
        calls[name].append(int(client_id))
        return original(client_id, *args, **kwargs)

    setattr(obj, name, wrapper)


@pytest.mark.filterwarnings("ignore::resfl_lightning.federation.faults.ClientDroppedWarning")  # 2 validation rows
def test_a_round_at_10000_clients_touches_only_its_sampled_clients(tmp_path):
    data = tiny_data(NUM_CLIENTS, rows_per_client=8)
    fed = Federation(fabric=L.Fabric(accelerator="cpu", devices=1), client_factory=client_factory, data=data,
                     aggregator=FedAvg(), settings=FederationSettings(rounds=2, run_dir=tmp_path,
                                                                       clients_per_round=SAMPLED))
    calls: dict[str, list[int]] = defaultdict(list)
    for name in ("train_loader", "val_loader", "num_train", "recalibration_loader"):
        _recording(data, name, calls)
    for name in ("get", "put", "path"):
        _recording(fed.client_states, name, calls)
    fed.fit()
    each_round = sorted(sample_clients(0, 0, NUM_CLIENTS, SAMPLED) + sample_clients(0, 1, NUM_CLIENTS, SAMPLED))
    assert len(set(each_round)) > SAMPLED  # two different samples
    # one epoch a round: one training loader and one state read a sampled client and round
    assert sorted(calls["train_loader"]) == sorted(calls["get"]) == each_round
    for name in ("val_loader", "num_train", "put", "path"):
        assert set(calls[name]) <= set(each_round), name
        assert len(calls[name]) <= 8 * len(each_round), (name, len(calls[name]))  # a few calls a client, not N
    assert calls["put"] and set(calls["put"]) <= set(each_round)  # a dropped client keeps its previous state
    stored = sorted(int(p.stem.split("_")[1]) for p in fed.client_states.directory.glob("client_*.pt"))
    assert stored == sorted(set(calls["put"]))


def test_store_byte_count_is_kept_not_resummed_on_every_put(tmp_path):
    store = ClientStateStore(tmp_path, memory_budget_bytes=2**30)
    for i in range(2_000):
        store.put(i, 0, {"w": torch.zeros(4)})
    with mock.patch.object(client_state, "state_bytes", wraps=state_bytes) as counted:
        store.put(7, 1, {"w": torch.zeros(8)})  # an overwrite: the new state's bytes and the replaced one's
        store.put(5_000, 1, {"w": torch.zeros(8)})  # a new client: its bytes only
    assert counted.call_count == 3
    assert store.memory_bytes() == sum(state_bytes(store.get(i)) for i in [*range(2_000), 5_000]) == 1_999 * 16 + 64


def test_store_byte_count_matches_the_states_held_through_evictions_and_resume(tmp_path):
    store = ClientStateStore(tmp_path, memory_budget_bytes=10 * 40)  # about 10 states of 10 floats
    gen = torch.Generator().manual_seed(0)
    for step in range(300):
        cid = int(torch.randint(0, 40, (1,), generator=gen))
        size = int(torch.randint(1, 20, (1,), generator=gen))
        if step % 7 == 0:
            store.get(cid)
        else:
            store.put(cid, step, {"w": torch.zeros(size), "b": torch.zeros(2, dtype=torch.float64)})
        held = sum(state_bytes(s) for s in store._cache.values())  # the independent re-sum
        assert store.memory_bytes() == held
        assert len(store) == 1 or held <= store.budget
        if step == 150:
            store.commit()
            store.restore_to(step)
            assert store.memory_bytes() == 0


def test_a_fresh_run_does_not_read_the_client_states_an_earlier_run_left(tmp_path):
    """A second run into the same run_dir (resume=false) read the first run's checkpoints/clients/ files back as its
    clients' states (RESFL's phi), and trained other bits than the first; a resumed run must still read them."""
    earlier = ClientStateStore(tmp_path)
    earlier.put(3, 5, {"phi": torch.ones(4)})
    earlier.commit()
    fresh = ClientStateStore(tmp_path, memory_budget_bytes=0)  # no memory: every state goes through its file
    fresh.start_fresh()
    assert fresh.get(3) is None
    fresh.put(3, 0, {"phi": torch.zeros(4)})
    fresh.put(4, 0, {"phi": torch.full((4,), 2.0)})  # evicts client 3 to its file
    fresh.commit()
    assert torch.equal(fresh.get(3)["phi"], torch.zeros(4))  # this run's own spilled state is read back
    versions = torch.load(fresh.path(3), weights_only=True)["versions"]
    assert [v["round"] for v in versions] == [0]  # the earlier run's round-5 version is not kept beside it
    resumed = ClientStateStore(tmp_path)
    resumed.restore_to(0)
    assert torch.equal(resumed.get(3)["phi"], torch.zeros(4))
