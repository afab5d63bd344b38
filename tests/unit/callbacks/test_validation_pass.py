"""The global model's final validation pass (val/*, what `resfl tune` selects on): last round only, over every
client's validation split, without touching the torch RNG the attacks draw from next, and re-scored by
PrivFairFL-Post's calibration like the test pass."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from resfl_lightning.baselines.post_calibration import PostCalibration
from resfl_lightning.baselines.privfairfl import Calibration
from resfl_lightning.callbacks.evaluation import GlobalEvaluation
from resfl_lightning.data.federated import ClientSplitLoaders
from resfl_lightning.data.partition import ClientSplit, FederatedSplits


class _Rows(ClientSplitLoaders):
    """Rows 0..9: test 0-1, client 0 val 4-5, client 1 val 8-9."""

    def __init__(self):
        clients = [ClientSplit(train=np.array([2, 3]), val=np.array([4, 5])),
                   ClientSplit(train=np.array([6, 7]), val=np.array([8, 9]))]
        self.splits = FederatedSplits(test=np.array([0, 1]), reserve=np.array([], dtype=np.int64), clients=clients,
                                      partition="iid", alpha=None, seed=0, h_tv=0.0)

    def _loader(self, indices, shuffle, seed=0, train=False, augment=True):
        return DataLoader(TensorDataset(torch.as_tensor(indices)), batch_size=2)


class _Model:
    """'Evaluates' by listing the rows it saw; its metrics: how many rows."""

    def test_outputs(self, loader):
        return [int(i) for (batch,) in loader for i in batch]

    def test_metrics_from(self, rows):
        return {"accuracy": len(rows) / 10, "rows": float(sum(rows))}


def _federation(rounds: int):
    return SimpleNamespace(fabric=SimpleNamespace(is_global_zero=True), data=_Rows(),
                           settings=SimpleNamespace(rounds=rounds))


def test_the_last_round_adds_val_metrics_over_every_clients_validation_rows_and_keeps_the_rng():
    fed, evaluation = _federation(rounds=3), GlobalEvaluation(every=1, final_validation=True)
    earlier: dict = {}
    evaluation.on_round_end(fed, 1, _Model(), earlier)
    assert "val/accuracy" not in earlier and evaluation.validation_pass(1) is None
    torch.manual_seed(0)
    list(fed.data.test_loader())  # what the test pass alone draws from the RNG
    expected = torch.random.get_rng_state()
    torch.manual_seed(0)
    metrics: dict = {}
    evaluation.on_round_end(fed, 2, _Model(), metrics)
    assert torch.equal(torch.random.get_rng_state(), expected)
    assert metrics["val/rows"] == 4 + 5 + 8 + 9 and metrics["test/rows"] == 0 + 1
    assert evaluation.validation_pass(2).outputs == [4, 5, 8, 9]


def test_privfairfl_post_rescores_the_validation_pass(monkeypatch):
    p1 = torch.tensor([0.9, 0.45, 0.3, 0.6])
    outputs = SimpleNamespace(probs=torch.stack([1 - p1, p1], 1), y=torch.tensor([1, 1, 0, 0]),
                              groups=torch.tensor([0, 1, 0, 1]), y_pred=(p1 >= 0.5).long())
    evaluation = GlobalEvaluation(every=1, final_validation=True)
    from resfl_lightning.evaluation.evaluation_pass import EvaluationPass

    evaluation.latest = EvaluationPass(4, outputs, {})
    evaluation.validation = EvaluationPass(4, outputs, {})
    cal = Calibration(temperature=1.0, thresholds={0: 0.5, 1: 0.4}, default=0.5)  # group 1's 0.45 becomes a 1
    monkeypatch.setattr("resfl_lightning.baselines.post_calibration.fit_post_calibration", lambda *a: cal)
    metrics = {"test/accuracy": 0.5, "val/accuracy": 0.5}
    PostCalibration(None, evaluation).on_round_end(_federation(5), 4, [], SimpleNamespace(num_groups=2), metrics)
    assert metrics["val/accuracy"] == metrics["test/accuracy"] == 0.75
    assert metrics["val/uncalibrated/accuracy"] == 0.5


def test_the_validation_pass_is_off_unless_asked_for():
    fed, evaluation, metrics = _federation(rounds=3), GlobalEvaluation(every=1), {}
    evaluation.on_round_end(fed, 2, _Model(), metrics)
    assert "test/rows" in metrics and not any(k.startswith("val/") for k in metrics)
    assert evaluation.validation_pass(2) is None
