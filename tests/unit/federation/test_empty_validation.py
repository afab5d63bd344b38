"""dataset.small_clients=warn keeps clients with no validation item: they train and their update is aggregated,
with their validation utility and u "not measured" (NaN utility, u = insufficient_u), as the warning says. Before,
their evaluation raised and every such client was dropped (10,000 virtual clients on Adult's rows: no round ran)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from resfl_lightning.aggregation.ufm_softmax import UfmSoftmax
from resfl_lightning.clients.base import UfmSettings
from resfl_lightning.data.partition import SmallClientWarning
from resfl_lightning.data.tabular import federated_tabular_data
from tests.federation_helpers import FEATURES, GROUPS, run_federation


def no_validation_data(num_clients: int = 4, rows: int = 4):
    rng = np.random.default_rng(0)
    n = num_clients * rows
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    s = rng.integers(0, GROUPS, n)
    y = (x[:, 0] > 0).astype(np.int64)
    with pytest.warns(SmallClientWarning, match="no validation item"):
        return federated_tabular_data(x, y, s, x[:8], y[:8], s[:8], num_groups=GROUPS, num_clients=num_clients,
                                      reserve_fraction=0.0, val_fraction=0.1, partition="iid", dirichlet_alpha=0.5,
                                      batch_size=2, eval_batch_size=8, seed=0)


@pytest.mark.parametrize("aggregator", [None, UfmSoftmax()], ids=["fedavg", "ufm_softmax"])
def test_clients_without_a_validation_item_are_aggregated_not_dropped(tmp_path, aggregator):
    data = no_validation_data()
    assert all(len(c.val) == 0 for c in data.splits.clients)
    _, state, recorder = run_federation(tmp_path, num_clients=4, rounds=2, data=data, aggregator=aggregator)
    reports = recorder.reports
    assert sorted(rid for rid, _ in recorder.deltas) == [0] * 4 + [1] * 4  # every client, every round
    assert not torch.equal(state.theta, recorder.initial)
    insufficient = UfmSettings(gate=None).insufficient_u
    assert len(reports) == 8
    for r in reports:  # "not measured", as dataset.small_clients=warn says
        assert math.isnan(r.val_utility) and math.isnan(r.ufm_raw) and r.u == insufficient
