"""`preview` (what a rule-tailored attack evaluates): every built-in rule previews exactly the aggregate it then
applies to the same stack, and a preview leaves the rule as it was (logged weights, the aggregate it carries)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from resfl_lightning.aggregation import centered_clipping, resfl_robust
from resfl_lightning.aggregation.bulyan import Bulyan
from resfl_lightning.aggregation.centered_clipping import CenteredClipping
from resfl_lightning.aggregation.fedavg import FedAvg
from resfl_lightning.aggregation.flame import Flame
from resfl_lightning.aggregation.fltrust import FLTrust
from resfl_lightning.aggregation.krum import Krum
from resfl_lightning.aggregation.median import CoordinateMedian
from resfl_lightning.aggregation.norm_bounding import NormBounding
from resfl_lightning.aggregation.resfl_robust import RobustResfl
from resfl_lightning.aggregation.trimmed_mean import TrimmedMean
from resfl_lightning.aggregation.ufm_softmax import UfmSoftmax
from resfl_lightning.federation.checkpoint import ServerState
from resfl_lightning.types import ClientReport

N, P = 7, 6
MASK = torch.tensor([True, True, True, True, True, False])  # the last coordinate is a buffer
G0 = torch.tensor([1.0, 0.5, 0.0, -0.2, 0.3, 0.0], dtype=torch.float64)


class Root:
    """A server root whose evaluation depends on the update alone (a preview may evaluate any number of them)."""

    def update(self) -> torch.Tensor:
        return G0

    def begin_round(self, state, round_idx: int) -> None:
        pass

    def evaluate(self, delta: torch.Tensor):
        return SimpleNamespace(ufm_raw=float(delta.double().abs().sum()) % 3, utility=0.8, ufm_se=0.05)


def reports() -> list[ClientReport]:
    return [ClientReport(client_id=i, num_samples=10 + i, ufm_raw=0.1 * i, ufm_ema=0.1 * i, u=0.1 * i, gated=False,
                         val_utility=0.8, val_utility50=0.8, eval_loss=1.0, ufm_se=0.05) for i in range(N)]


def with_root(rule):
    rule.root = Root()
    return rule


RULES = {
    "fedavg": FedAvg, "ufm_softmax": lambda: UfmSoftmax(beta=2.0), "median": CoordinateMedian,
    "trimmed_mean": lambda: TrimmedMean(beta=0.2), "krum": lambda: Krum(f=1), "multi_krum": lambda: Krum(f=1, m=None),
    "bulyan": lambda: Bulyan(f=1), "norm_bounding": NormBounding, "centered_clipping": CenteredClipping,
    "fltrust": lambda: with_root(FLTrust()), "flame": Flame,
    "resfl_robust": lambda: with_root(RobustResfl(clip="centered")),
    "resfl_robust_checked": lambda: with_root(RobustResfl(mode="checked", combiner="median")),
}
PREVIOUS = {centered_clipping.PREVIOUS_KEY: torch.full((P,), 0.1, dtype=torch.float64),
            resfl_robust.PREVIOUS_KEY: torch.full((P,), 0.1, dtype=torch.float64)}


def started(name: str):
    rule = RULES[name]()
    rule.param_mask = MASK
    state = ServerState(round_idx=0, theta=torch.zeros(P), int_buffers={}, extra=dict(PREVIOUS))
    rule.begin_round(state, 0)
    return rule, state


def stacks() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    first = torch.randn(N, P, generator=gen) + 0.5
    second = first.clone()
    second[:2] = -3.0 * first[:2]  # two rows an attack replaced
    return first, second


def applied(rule, deltas: torch.Tensor) -> torch.Tensor:
    """The round's aggregate as the orchestrator applies it to a gathered stack."""
    return rule.preview(deltas, reports()) if not rule.gathers_all else rule.aggregate_round(deltas, reports())


@pytest.mark.parametrize("name", list(RULES))
def test_a_preview_is_the_aggregate_the_rule_then_applies(name):
    _, second = stacks()
    rule, _ = started(name)
    preview = rule.preview(second, reports())
    torch.testing.assert_close(applied(rule, second), preview, rtol=0, atol=0)
    fresh, _ = started(name)
    torch.testing.assert_close(applied(fresh, second), preview, rtol=0, atol=0)


@pytest.mark.parametrize("name", [n for n in RULES if RULES[n]().gathers_all])
def test_a_preview_leaves_the_rules_weights_and_carried_state_alone(name):
    first, second = stacks()
    rule, state = started(name)
    aggregate = rule.aggregate_round(first, reports())
    weights = rule.weights(reports())
    carried = rule.end_round(state).extra
    before = dict(vars(rule))
    rule.preview(second, reports())
    assert rule.weights(reports()) == weights and vars(rule).keys() == before.keys()
    assert all(vars(rule)[k] is v for k, v in before.items())
    after = rule.end_round(state).extra
    assert after.keys() == carried.keys() and all(torch.equal(after[k], carried[k]) for k in carried)
    torch.testing.assert_close(started(name)[0].aggregate_round(first, reports()), aggregate, rtol=0, atol=0)


def test_a_streaming_rule_previews_its_softmax_weighted_sum():
    _, second = stacks()
    rule = UfmSoftmax(beta=2.0)
    w = torch.softmax(torch.tensor([-2.0 * 0.1 * i for i in range(N)], dtype=torch.float64), dim=0)
    torch.testing.assert_close(rule.preview(second, reports()), (w[:, None] * second.double()).sum(dim=0))
