"""DP-SGD's accounting numbers in a run's logs and summary: the NSR zC/(B ||g_c||) with g_c the noise-free mean of
opacus' clipped per-sample gradients, measured without changing the training, and the per-client numbers (z, q,
steps, B, C, delta) reduced to the run's `dp/` metrics."""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch
from opacus.optimizers import DPOptimizer

from callbacks.reports import ClientReportLogger, dp_run_metrics
from callbacks.run_files import SUMMARY_PREFIXES
from resfl_lightning.federation.local import local_train
from resfl_lightning.privacy.dp import (
    CLIPPING_KEY,
    SIGNAL_KEY,
    ClientDPOptimizer,
    DPSettings,
    planned_steps,
    sample_rate,
)
from resfl_lightning.privacy.report import EPSILON_KEY, STATISTICS_KEY
from resfl_lightning.privacy.signal import median_noise_to_signal, noise_to_signal
from resfl_lightning.types import ClientReport
from tests.unit.clients.test_tabular_client import toy_data
from tests.unit.privacy.test_dp_sgd import clipped_step_setup, dp_of, dp_tabular_client

torch.set_num_threads(1)


def test_nsr_by_hand():
    # z = 1.5, C = 1, B = 64, ||g_c|| = 0.05: the noise along g_c has sd 1.5/64 = 0.0234375, NSR = 0.46875
    assert noise_to_signal(1.5, 1.0, 64, 0.05) == pytest.approx(0.46875, rel=1e-15)
    # z = 2, C = 0.5, B = 10: per step 1/(10 ||g_c||); a zero signal is inf; no noise is 0 whatever the signal
    np.testing.assert_allclose(noise_to_signal(2.0, 0.5, 10, [0.1, 0.2, 0.4, 0.0]), [1.0, 0.5, 0.25, math.inf])
    np.testing.assert_array_equal(noise_to_signal(0.0, 1.0, 10, [0.3, 0.0]), [0.0, 0.0])
    assert median_noise_to_signal(2.0, 0.5, 10, [0.1, 0.2, 0.4]) == 0.5  # the median step, not the mean (0.583)
    assert math.isnan(median_noise_to_signal(1.0, 1.0, 10, []))
    with pytest.raises(ValueError, match="NSR needs"):
        noise_to_signal(1.0, 0.0, 10, 0.1)


def test_signal_is_the_norm_of_the_clipped_mean_of_independent_per_example_gradients():
    """One noisy step: the recorded ||g_c|| equals ||sum_i clip_C(g_i)|| / B with the g_i of a hook-free copy of the
    model, i.e. the signal before the noise; the step's noise does not enter it."""
    clip = 0.05
    client, optimizer, batch, grads = clipped_step_setup(clip, noise_multiplier=3.0)
    assert max(float(g.norm()) for g in grads) > clip  # some are clipped
    clipped_sum = torch.stack([g * min(1.0, clip / (float(g.norm()) + 1e-6)) for g in grads]).sum(0)
    client.train()
    loss = client.training_step(batch, 0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    b = optimizer.expected_batch_size
    (signal,) = dp_of(client).signal_history()
    assert signal == pytest.approx(float(clipped_sum.norm()) / b, rel=1e-4)
    assert signal < clip  # the mean of clipped vectors; a per-sample norm would sit at C
    stats = dp_of(client).statistics()
    assert stats["nsr"] == pytest.approx(3.0 * clip / float(clipped_sum.norm()), rel=1e-4)  # B cancels


@pytest.mark.parametrize("clipping", ["bookkeeping", "per_sample"])
def test_per_example_norms_against_the_clip_are_those_of_independent_gradients(clipping):
    """One step, both clipping paths: the recorded median ||g_i|| and share of clipped examples equal those of the
    per-example gradients of a hook-free copy of the model."""
    clip = 1.0  # between this batch's smallest and largest ||g_i|| (0.76 to 2.0)
    client, optimizer, batch, grads = clipped_step_setup(clip, noise_multiplier=1.0, clipping=clipping)
    norms = torch.stack([g.norm() for g in grads])
    assert 0 < float((norms > clip).double().mean()) < 1  # a case where the share is neither 0 nor 1
    client.train()
    loss = client.training_step(batch, 0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    ((median, share),) = dp_of(client).clipping_history()
    assert median == pytest.approx(float(norms.median()), rel=1e-4)
    assert share == pytest.approx(float((norms > clip).double().mean()), abs=1e-12)
    stats = dp_of(client).statistics()
    assert stats["grad_norm_median"] == pytest.approx(median) and stats["clipped_share"] == pytest.approx(share)


def _train(measure: bool, monkeypatch) -> tuple[list[torch.Tensor], object]:
    if not measure:  # opacus' own add_noise: nothing is read before the noise
        monkeypatch.setattr(ClientDPOptimizer, "add_noise", DPOptimizer.add_noise)
    settings = DPSettings(target_epsilon=None, noise_multiplier=1.0, rounds=1, local_epochs=2)
    client = dp_tabular_client(settings)  # seeds torch: the same init and noise stream for both runs
    data = toy_data(batch_size=16)
    fabric = L.Fabric(accelerator="cpu", devices=1)
    local_train(fabric, client, lambda e: data.train_loader(0, seed=e), epochs=2)
    monkeypatch.undo()
    return [p.detach().clone() for p in client.model.parameters()], client


def test_measuring_the_signal_leaves_the_trained_model_bitwise_unchanged(monkeypatch):
    with_measure, client = _train(True, monkeypatch)
    without, plain = _train(False, monkeypatch)
    for a, b in zip(with_measure, without, strict=True):
        assert torch.equal(a, b)
    steps = planned_steps(dp_of(client).settings, dp_of(client).q)
    assert len(dp_of(client).signal_history()) == steps > 1
    assert dp_of(plain).signal_history() == []


def test_statistics_and_their_client_state(monkeypatch):
    _, client = _train(True, monkeypatch)
    data = toy_data(batch_size=16)
    q = sample_rate(data.num_train(0), 16)
    stats = dp_of(client).statistics()
    signal = dp_of(client).signal_history()
    b, steps = round(q * data.num_train(0)), planned_steps(dp_of(client).settings, q)
    assert stats == {"noise_multiplier": 1.0, "sample_rate": q, "steps": float(steps),
                     "expected_batch_size": float(b), "max_grad_norm": 1.0, "target_epsilon": stats["target_epsilon"],
                     "delta": 1e-6, "nsr": pytest.approx(float(np.median([1.0 / (b * s) for s in signal]))),
                     "grad_norm_median": stats["grad_norm_median"], "clipped_share": stats["clipped_share"]}
    rows = dp_of(client).clipping_history()
    assert len(rows) == len(signal)  # one row a DP-SGD step
    assert stats["grad_norm_median"] == pytest.approx(float(np.median([r[0] for r in rows])))
    assert stats["clipped_share"] == pytest.approx(float(np.mean([r[1] for r in rows])))
    assert math.isnan(stats["target_epsilon"])  # a fixed z has no target
    state = dp_of(client).export_state()
    assert state[SIGNAL_KEY].tolist() == signal and state[CLIPPING_KEY].tolist() == rows
    other = dp_tabular_client(dp_of(client).settings)
    dp_of(other).import_state(state)  # a resumed client keeps its steps' signal (the run's median stays the run's)
    assert dp_of(other).signal_history() == signal and dp_of(other).statistics() == {}  # no step this round yet
    assert dp_of(other).clipping_history() == rows
    dp_of(other).import_state(None)
    assert dp_of(other).signal_history() == [] and dp_of(other).clipping_history() == []


def _report(cid: int, **dp) -> ClientReport:
    return ClientReport(client_id=cid, num_samples=10, ufm_raw=0.1, ufm_ema=0.1, u=0.1, gated=False, val_utility=0.8,
                        val_utility50=0.8, eval_loss=0.5, extras={EPSILON_KEY: 0.9, STATISTICS_KEY: dp})


def test_run_metrics_are_medians_over_clients_and_the_most_steps():
    latest = {0: {"noise_multiplier": 2.0, "steps": 100.0, "nsr": 0.3, "target_epsilon": 1.0},
              1: {"noise_multiplier": 2.2, "steps": 90.0, "nsr": 0.5, "target_epsilon": 1.0},
              2: {"noise_multiplier": 2.1, "steps": 100.0, "nsr": 0.4, "target_epsilon": 1.0}}
    assert dp_run_metrics(latest) == {"dp/noise_multiplier": 2.1, "dp/steps": 100.0, "dp/nsr": 0.4,
                                      "dp/target_epsilon": 1.0}
    assert math.isnan(dp_run_metrics({0: {"target_epsilon": math.nan}})["dp/target_epsilon"])


def test_report_logger_writes_run_level_dp_metrics_into_the_summary_prefixes():
    logger, metrics = ClientReportLogger(), {}
    logger.on_round_end([_report(0, nsr=0.2, steps=5.0), _report(1, nsr=0.4, steps=5.0)], {0: 0.5, 1: 0.5}, metrics)
    assert metrics["dp/nsr"] == pytest.approx(0.3) and metrics["client/1/dp_nsr"] == 0.4
    metrics = {}
    logger.on_round_end([_report(1, nsr=0.6, steps=10.0)], {1: 1.0}, metrics)  # client 0 not sampled: its latest
    assert metrics["dp/nsr"] == pytest.approx(0.4) and metrics["dp/steps"] == 10.0
    assert all(k.startswith(SUMMARY_PREFIXES) for k in metrics if k.startswith("dp/"))
    plain, metrics = ClientReportLogger(), {}
    plain.on_round_end([ClientReport(client_id=0, num_samples=1, ufm_raw=0.1, ufm_ema=0.1, u=0.1, gated=False,
                                     val_utility=0.8, val_utility50=0.8, eval_loss=0.5)], {0: 1.0}, metrics)
    assert not any(k.startswith("dp/") for k in metrics)
