"""metrics.min_group_size on the global evaluation: a test group of 12 rows is left out of every group metric of the
pass (rates, |1-DI|, delta-EOP, EOD, UFM's group terms) but not of accuracy; the kept groups' values are fairlearn's;
the summary names the group; PrivFairFL-Post's rule still reads every row's own group."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fairlearn.metrics import MetricFrame, demographic_parity_ratio, selection_rate, true_positive_rate

from resfl_lightning.baselines.post_calibration import PostCalibration
from resfl_lightning.baselines.privfairfl import Calibration
from resfl_lightning.callbacks.evaluation import GlobalEvaluation
from resfl_lightning.callbacks.run_files import RunFiles
from resfl_lightning.data.tabular import federated_tabular_data
from resfl_lightning.evaluation.evaluation_pass import (
    EvaluationPass,
    eod_from_pass,
    kept_test_metrics,
    run_evaluation_pass,
)
from resfl_lightning.metrics.eod import classification_eod
from resfl_lightning.metrics.ufm import ufm_from_samples
from tests.unit.clients.test_tabular_client import NUM_FEATURES, make_client, train_steps

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def trained():
    """Three groups in training; the test split holds 150 rows of A and C and 12 of B."""
    rng = np.random.default_rng(0)

    def rows(groups):
        s = np.asarray(groups)
        x = rng.normal(size=(s.size, NUM_FEATURES)).astype(np.float32)
        x[:, 0] += 0.8 * (s - 1)
        y = (x[:, 0] + 0.5 * rng.normal(size=s.size) > 0).astype(np.int64)
        return x, y, s

    xa, ya, sa = rows(rng.permutation([0] * 200 + [1] * 120 + [2] * 200))
    xb, yb, sb = rows(rng.permutation([0] * 150 + [1] * 12 + [2] * 150))
    data = federated_tabular_data(xa, ya, sa, xb, yb, sb, num_groups=3, num_clients=2, partition="iid",
                                  dirichlet_alpha=0.5, reserve_fraction=0.05, val_fraction=0.2, batch_size=32,
                                  eval_batch_size=64, seed=0, group_names=("A", "B", "C"))
    client = make_client()
    train_steps(client, data, 40)
    client.eval()
    return data, client


def test_a_small_test_group_is_left_out_of_every_group_metric_of_the_pass(trained):
    data, client = trained
    evaluation = run_evaluation_pass(client, data.test_loader(), 0, min_group_size=30)
    assert evaluation.groups_excluded == {1: 12}
    out, pred = evaluation.metrics, evaluation.outputs
    y, y_hat, s = pred.y.numpy(), pred.y_pred.numpy(), pred.groups.numpy()
    assert (s == 1).sum() == 12  # the pass keeps the raw outputs; the metrics read the measured ones

    kept = s != 1
    frame = MetricFrame(metrics={"sr": selection_rate, "tpr": true_positive_rate}, y_true=y[kept], y_pred=y_hat[kept],
                        sensitive_features=s[kept])
    for g in (0, 2):
        assert out[f"selection_rate/{g}"] == pytest.approx(frame.by_group.loc[g, "sr"])
        assert out[f"tpr/{g}"] == pytest.approx(frame.by_group.loc[g, "tpr"])
    di = demographic_parity_ratio(y[kept], y_hat[kept], sensitive_features=s[kept])
    assert out["abs_one_minus_di"] == pytest.approx(1 - di)
    assert out["delta_eop"] == pytest.approx(frame.by_group["tpr"].max() - frame.by_group["tpr"].min())
    assert out["accuracy"] == pytest.approx((y == y_hat).mean())  # all 312 rows
    assert not {"tpr/1", "selection_rate/1", "fpr/1", "mean_evidence/1"} & set(out)
    ufm = ufm_from_samples(pred.alpha0[kept], pred.groups[kept], evidence_floor=client.ufm.evidence_floor,
                           eps=client.ufm.eps)
    assert out["ufm"] == pytest.approx(ufm.ufm) and set(ufm.mean_evidence) == {0, 2}

    eod = eod_from_pass(client, evaluation, 3, protected=0, unprotected=None)
    assert eod == classification_eod(y[kept], y_hat[kept], s[kept], 3, protected_group=0)
    assert kept_test_metrics(client, data.test_loader(), 30) == out

    every = run_evaluation_pass(client, data.test_loader(), 0)  # the default keeps every group, as before
    assert every.groups_excluded == {} and "tpr/1" in every.metrics and "mean_evidence/1" in every.metrics
    assert every.metrics == client.test_metrics(data.test_loader())


def _federation(data, rounds: int = 1):
    fabric = SimpleNamespace(is_global_zero=True, loggers=[], log_dict=lambda *a, **k: None)
    return SimpleNamespace(fabric=fabric, data=data, settings=SimpleNamespace(rounds=rounds), config=None)


@pytest.mark.parametrize("min_group_size", [1, 30])
def test_the_summary_names_the_left_out_groups(trained, tmp_path, capsys, min_group_size):
    data, client = trained
    fed = _federation(data)
    evaluation = GlobalEvaluation(every=1, min_group_size=min_group_size)
    files = RunFiles(tmp_path, evaluation=evaluation)
    files.on_fit_start(fed, SimpleNamespace(round_idx=-1))
    metrics: dict = {"round": 0}
    evaluation.on_round_end(fed, 0, client, metrics)
    files.on_metrics(fed, 0, metrics)
    files.on_fit_end(fed)
    summary = json.loads((tmp_path / "summary.json").read_text())
    said = capsys.readouterr().out
    if min_group_size == 1:  # nothing is said where nothing can be left out: summaries as before the key existed
        assert "test/groups_excluded" not in summary and "min_group_size" not in said
        assert summary["test/tpr/1"] is not None
    else:
        assert summary["test/groups_excluded"] == {"B": 12} and "test/tpr/1" not in summary
        assert "metrics.min_group_size=30: left out of the test group metrics: B (12)" in said


def test_privfairfl_post_decides_with_every_rows_own_group_and_measures_the_kept_ones(monkeypatch):
    p1 = torch.tensor([0.9, 0.45, 0.3, 0.6])
    outputs = SimpleNamespace(probs=torch.stack([1 - p1, p1], 1), y=torch.tensor([1, 1, 0, 0]),
                              groups=torch.tensor([0, 1, 0, 1]), y_pred=(p1 >= 0.5).long())
    evaluation = GlobalEvaluation(every=1, min_group_size=3)
    evaluation.latest = EvaluationPass(4, outputs, {}, groups_excluded={1: 2})
    cal = Calibration(temperature=1.0, thresholds={0: 0.5, 1: 0.4}, default=0.5)  # group 1's 0.45 becomes a 1
    monkeypatch.setattr("resfl_lightning.baselines.post_calibration.fit_post_calibration", lambda *a: cal)
    metrics = {"test/accuracy": 0.5}
    fed = SimpleNamespace(fabric=SimpleNamespace(is_global_zero=True))
    PostCalibration(None, evaluation).on_round_end(fed, 4, [], SimpleNamespace(num_groups=2), metrics)
    assert metrics["test/accuracy"] == 0.75  # row 1 kept group 1's threshold although group 1 is not measured
    assert "test/selection_rate/1" not in metrics and metrics["test/selection_rate/0"] == 0.5
