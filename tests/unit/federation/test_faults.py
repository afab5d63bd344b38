"""Client failures never end a run: each injected fault drops only that client from that round's
aggregation, with a warning naming client and round; a quorum decides whether the round is applied."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

from resfl_lightning.aggregation.fairfed import FairFed, fairfed_update, fairness_gaps
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.federation.faults import (
    ClientDroppedWarning,
    ClientFault,
    FaultPlan,
    check_group_stats,
    check_update,
)
from resfl_lightning.federation.orchestrator import FederationSettings, TooManySkippedRounds, skipped_in_a_row
from resfl_lightning.federation.state import FlatLayout
from resfl_lightning.types import ClientReport
from tests.federation_helpers import client_factory, run_federation, tiny_data

# fault -> text the drop warning must contain (the reason the client was left out)
FAULT_REASONS = {
    "raise": "injected failure",
    "nan_loss": "non-finite loss",
    "nan_update": "non-finite values",
    "bad_report": "u=nan",
}


def _drops(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ClientDroppedWarning)]


def fedavg(theta: torch.Tensor, deltas: dict[int, torch.Tensor], sizes: dict[int, int]) -> torch.Tensor:
    """Hand-computed FedAvg of the given clients' deltas (float64, as the server sums)."""
    total = sum(sizes[i] for i in deltas)
    mean = sum(deltas[i].double() * (sizes[i] / total) for i in deltas)
    return (theta.double() + mean).float()


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A fault-free round 0 of 3 clients: every client's delta and the initial theta."""
    fed, state, rec = run_federation(tmp_path_factory.mktemp("clean"), num_clients=3)
    return fed, rec


@pytest.mark.parametrize("fault", list(FAULT_REASONS))
def test_each_fault_drops_only_that_client(fault, clean, tmp_path):
    clean_fed, clean_rec = clean
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fed, state, rec = run_federation(tmp_path, num_clients=3, fail_clients=(f"1:0:{fault}",))
    drops = _drops(caught)
    assert len(drops) == 1 and drops[0].startswith("client 1, round 0: dropped") and FAULT_REASONS[fault] in drops[0]
    m = rec.metrics[0]
    assert (m["client/1/dropped"], m["client/0/dropped"], m["client/2/dropped"]) == (1.0, 0.0, 0.0)
    assert (m["round/aggregated"], m["round/dropped"], m["round/skipped"]) == (2.0, 1.0, 0.0)
    # theta_G = FedAvg over the two healthy clients, whose deltas the clean run produced (same per-client seeds)
    sizes = {i: clean_fed.data.num_train(i) for i in range(3)}
    torch.testing.assert_close(clean_rec.thetas[0], fedavg(clean_rec.initial, {i: clean_rec.deltas[(0, i)]
                                                                               for i in range(3)}, sizes))
    expected = fedavg(clean_rec.initial, {i: clean_rec.deltas[(0, i)] for i in (0, 2)}, sizes)
    torch.testing.assert_close(state.theta, expected, rtol=1e-5, atol=1e-6)
    assert torch.isfinite(state.theta).all()
    # the dropped client's own state is not updated (its first round: nothing stored); the others' are
    assert fed.client_states.get(1) is None and fed.client_states.get(0) is not None


def test_a_client_dropped_at_its_evaluation_counts_its_training_time_with_its_steps(tmp_path):
    """time/steps counts every trained client's steps, so time/train must count every trained client's time (the
    10,000-client benchmark printed its steps with 0.0 s when every client's evaluation raised: 3 rows a client, no
    validation row). A fake clock advances 1 s a reading: each client's training window is exactly 1 s."""
    from itertools import count
    from types import SimpleNamespace
    from unittest import mock

    from resfl_lightning.federation import orchestrator

    evaluate = TabularClient.evaluate

    def evaluate_or_raise(self, loader):
        if self.client_id == 1:
            raise ValueError("TabularClient.collect: the loader yielded no batches")
        return evaluate(self, loader)

    clock = count()
    with mock.patch.object(orchestrator, "time", SimpleNamespace(perf_counter=lambda: float(next(clock)))), \
            mock.patch.object(TabularClient, "evaluate", evaluate_or_raise), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _, _, rec = run_federation(tmp_path, num_clients=2)
    assert any("client 1, round 0: dropped" in d for d in _drops(w))
    m = rec.metrics[0]
    assert m["round/dropped"] == 1.0 and m["time/steps"] > 0
    assert m["time/train"] == 2.0 and m["time/validate"] == 1.0  # both clients trained; one finished validating


def test_quorum_skips_the_round_and_keeps_theta(clean, tmp_path):
    _, clean_rec = clean
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fed, state, rec = run_federation(tmp_path, num_clients=3, rounds=2, min_clients=3,
                                         fail_clients=("2:0:raise",))
    skipped = [str(w.message) for w in caught if "skipped" in str(w.message)]
    assert len(skipped) == 1 and skipped[0].startswith("round 0: skipped, theta_G unchanged")
    assert "federation.min_clients=3" in skipped[0]
    assert [m["round/skipped"] for m in rec.metrics] == [1.0, 0.0]
    assert torch.equal(rec.initial, clean_rec.initial)
    assert torch.equal(rec.thetas[0], rec.initial)  # round 0 not applied
    assert not torch.equal(rec.thetas[1], rec.thetas[0])  # round 1 (no fault) is


def test_every_client_failing_every_round_ends_normally_with_theta_unchanged(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fed, state, rec = run_federation(tmp_path, num_clients=2, rounds=2,
                                         fail_clients=("0:*:nan_update", "1:*:raise"))
    assert len(_drops(caught)) == 4
    assert [m["round/aggregated"] for m in rec.metrics] == [0.0, 0.0]
    assert [m["round/skipped"] for m in rec.metrics] == [1.0, 1.0]
    assert torch.equal(rec.thetas[0], rec.thetas[1]) and torch.isfinite(state.theta).all()
    assert torch.load(fed.checkpoint_path, weights_only=True)["round_idx"] == 1


def test_too_many_skipped_rounds_in_a_row_end_the_run_naming_them(tmp_path):
    every_round = ("0:*:raise", "1:*:nan_loss")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TooManySkippedRounds, match=r"^rounds 0-2: 3 round\(s\) in a row skipped, more than "
                                                       r"federation\.max_skipped_rounds=2.*Last reason: 0 client"):
            run_federation(tmp_path, num_clients=2, rounds=6, max_skipped_rounds=2, fail_clients=every_round)
        saved = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
        assert saved["round_idx"] == 2  # the last skipped round's checkpoint is written before the run stops
        # resume keeps counting (the streak is in the checkpoint): the next skipped round stops it again
        with pytest.raises(TooManySkippedRounds, match=r"^rounds 0-3: 4 round\(s\) in a row"):
            run_federation(tmp_path, num_clients=2, rounds=6, max_skipped_rounds=2, fail_clients=every_round,
                           resume=True)


@pytest.mark.parametrize("limit, stops", [(None, False), (1, False), (0, True)])
def test_an_applied_round_resets_the_skipped_count(tmp_path, limit, stops):
    faults = ("0:0:raise", "1:0:raise", "0:2:raise", "1:2:raise")  # rounds 0 and 2 skipped, round 1 applied
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if stops:
            with pytest.raises(TooManySkippedRounds, match=r"^round 0: 1 round\(s\) in a row skipped, more than "
                                                           r"federation\.max_skipped_rounds=0"):
                run_federation(tmp_path, num_clients=2, rounds=3, max_skipped_rounds=limit, fail_clients=faults)
            return
        _, state, rec = run_federation(tmp_path, num_clients=2, rounds=3, max_skipped_rounds=limit,
                                       fail_clients=faults)
    assert [m["round/skipped"] for m in rec.metrics] == [1.0, 0.0, 1.0]
    assert skipped_in_a_row(state) == 1


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_max_skipped_rounds_is_checked(value):
    with pytest.raises(ValueError, match="federation.max_skipped_rounds"):
        FederationSettings(max_skipped_rounds=value)


def _report(**kw) -> ClientReport:
    base = dict(client_id=3, num_samples=10, ufm_raw=math.nan, ufm_ema=math.nan, u=0.5, gated=False,
                val_utility=0.7, val_utility50=0.7, eval_loss=0.4, train_losses={"task": 0.3})
    return ClientReport(**{**base, **kw})


@pytest.mark.parametrize("change, field", [
    (dict(num_samples=0), "num_samples"), (dict(num_samples=2.5), "num_samples"), (dict(u=math.inf), "u"),
    (dict(eval_loss=math.nan), "eval_loss"), (dict(val_utility="high"), "val_utility"),
    (dict(client_id=4), "names client 4"), (dict(train_losses={"task": math.nan}), "task"),
])
def test_malformed_reports_are_named(change, field):
    with pytest.raises(ClientFault, match=rf"client 3, round 7: .*{field}"):
        check_update(_report(**change), torch.zeros(4), 0.0, client_id=3, round_idx=7)


def test_healthy_report_passes_and_nan_where_unmeasured_is_allowed():
    check_update(_report(), torch.zeros(4), 0.0, client_id=3, round_idx=7)  # ufm_raw / ema / fim NaN are fine
    with pytest.raises(ClientFault, match="aggregation score"):
        check_update(_report(), torch.zeros(4), math.nan, client_id=3, round_idx=7)
    with pytest.raises(ClientFault, match="1 non-finite values"):
        check_update(_report(), torch.tensor([0.0, math.inf]), 0.0, client_id=3, round_idx=7)
    with pytest.raises(ClientFault, match="not a ClientReport"):
        check_update({"u": 1.0}, torch.zeros(4), 0.0, client_id=3, round_idx=7)


def test_fault_plan_parsing():
    plan = FaultPlan.parse(["1:0:raise", "2:*:nan_loss"])
    assert plan.fault(1, 0) == "raise" and plan.fault(1, 1) is None
    assert plan.fault(2, 0) == plan.fault(2, 9) == "nan_loss" and plan.fault(0, 0) is None
    for bad in ("1:0", "a:0:raise", "1:0:explode", "1:-1:raise"):
        with pytest.raises(ValueError, match="debug.fail_clients"):
            FaultPlan.parse([bad])
    report = _report()
    same_report, same_delta = plan.after_training(1, 0, report, torch.zeros(2))  # "raise" acts before training
    assert same_report is report and torch.equal(same_delta, torch.zeros(2))
    nan_delta = FaultPlan.parse(["1:0:nan_update"]).after_training(1, 0, report, torch.zeros(2))[1]
    assert nan_delta.isnan().tolist() == [True, False]
    bad_report, _ = FaultPlan.parse(["3:0:bad_report"]).after_training(3, 0, report, torch.zeros(2))
    assert math.isnan(bad_report.u) and replace(bad_report, u=0.5) == report


def _fairfed_weights(stats: dict[int, tuple], sizes: dict[int, int]) -> dict[int, float]:
    """FairFed's first-round weights over the clients in `stats`, from the pure functions."""
    total = sum(sizes[k] for k in stats)
    initial = {k: sizes[k] / total for k in stats}
    omega = fairfed_update(initial, fairness_gaps(stats), 1.0, initial)
    return {k: w / sum(omega.values()) for k, w in omega.items()}


class _StatsRaise(TabularClient):
    """A client whose pre-round group statistics raise on a loader marked corrupt (an unreadable shard, say)."""

    def group_outcomes(self, loader, num_groups):
        if getattr(loader, "corrupt", False):
            raise OSError("validation shard unreadable")
        return super().group_outcomes(loader, num_groups)


def _stats_raise_client():
    c = client_factory()
    c.__class__ = _StatsRaise
    return c


def _mark_val_corrupt(data, client_id: int):
    """data.val_loader(client_id) returns loaders marked corrupt (the client above then raises)."""
    original = data.val_loader

    def val_loader(cid):
        loader = original(cid)
        loader.corrupt = cid == client_id
        return loader
    data.val_loader = val_loader
    return data


def _fairfed_round0(data, initial: torch.Tensor, clients) -> dict[int, float]:
    """FairFed's round-0 weights over `clients`, from theta_G's counts on their validation splits."""
    probe = client_factory()
    layout = FlatLayout.of(probe)
    layout.load(probe, initial, layout.int_buffers(probe))
    stats = {k: tuple(t.numpy() for t in probe.group_outcomes(data.val_loader(k), data.num_groups)) for k in clients}
    return _fairfed_weights(stats, {k: data.num_train(k) for k in clients})


def test_fairfed_zero_weight_client_is_aggregated_with_weight_zero_not_dropped(tmp_path):
    """FairFed may drive a weight to exactly 0 (score -inf); before the fix that was reported as a client fault."""
    data = tiny_data(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fed, state, rec = run_federation(tmp_path, num_clients=3, data=data, aggregator=FairFed(beta=1.0))
    weights = _fairfed_round0(data, rec.initial, (0, 1, 2))
    assert min(weights.values()) == 0.0  # this data and beta give one zero weight: the case under test
    assert _drops(caught) == [] and rec.metrics[0]["round/aggregated"] == 3.0
    mean = sum(rec.deltas[(0, k)].double() * w for k, w in weights.items())
    torch.testing.assert_close(rec.thetas[0], (rec.initial.double() + mean).float())


@pytest.mark.parametrize("fault", ["bad_stats", "raise_in_stats"])
def test_fairfed_client_whose_group_statistics_fail_is_dropped_not_the_run(fault, tmp_path):
    """FairFed gathers per-group counts before local training; before the fix one client's failure there ended the
    run. Now that client is dropped with a warning naming it, and the others get FairFed's weights over themselves."""
    data = tiny_data(3)
    if fault == "raise_in_stats":
        data, factory, faults = _mark_val_corrupt(data, 1), _stats_raise_client, ()
    else:
        factory, faults = client_factory, ("1:0:bad_stats",)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fed, state, rec = run_federation(tmp_path, num_clients=3, data=data, aggregator=FairFed(beta=1.0),
                                         factory=factory, fail_clients=faults)
    drops = _drops(caught)
    reason = "are not finite" if fault == "bad_stats" else "OSError: validation shard unreadable"
    assert len(drops) == 1 and drops[0].startswith("client 1, round 0: dropped")
    assert "group statistics" in drops[0] and reason in drops[0]
    m = rec.metrics[0]
    assert (m["client/1/dropped"], m["round/aggregated"], m["round/skipped"]) == (1.0, 2.0, 0.0)
    assert (0, 1) not in rec.deltas and {(0, 0), (0, 2)} <= set(rec.deltas)
    weights = _fairfed_round0(data, rec.initial, (0, 2))  # FairFed over the survivors alone
    mean = sum(rec.deltas[(0, k)].double() * w for k, w in weights.items())
    torch.testing.assert_close(rec.thetas[0], (rec.initial.double() + mean).float())


def test_group_statistics_are_checked_naming_client_and_round():
    acc = np.array([5.0, 9.0])
    good = (np.array([1.0, 2.0]), np.array([3.0, 2.0]), acc)
    check_group_stats(good, 2, 4, 7)
    for bad, text in [((np.array([1.0]), np.array([3.0]), acc), "expected (2,)"),
                      ((np.array([np.nan, 2.0]), np.array([3.0, 2.0]), acc), "not finite"),
                      ((np.array([1.0, 2.0]), np.array([3.0, 2.0]), np.array([np.nan, 9.0])), "not finite"),
                      ((np.array([4.0, 2.0]), np.array([3.0, 2.0]), acc), "0 <= TP <= positives"),
                      ((np.array([-1.0, 0.0]), np.array([3.0, 2.0]), acc), "0 <= TP <= positives"),
                      ((np.array([1.0, 2.0]), np.array([3.0, 2.0]), np.array([10.0, 9.0])), "0 <= correct <= total"),
                      ((np.array([1.0, 2.0]), np.array([3.0, 2.0])), "not a (TP, positives, (correct, total))"),
                      ([1, 2], "not a (TP, positives, (correct, total))")]:
        with pytest.raises(ClientFault, match=r"client 4, round 7: group statistics") as err:
            check_group_stats(bad, 2, 4, 7)
        assert text in str(err.value)
