"""Rules that compare whole updates compare their parameters, not the BatchNorm buffers (aggregation/base.py).

On the Adult MLP the running statistics carry ~99 % of an update's norm and no attack touches them, so a cosine or a
distance over the whole vector is one of the buffers: FLTrust trusted sign-flipped updates as much as honest ones
(cosine +0.99 for all ten clients, attackers' weight share 0.199 = f/n in every round)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from resfl_lightning.aggregation.fltrust import FLTrust, fltrust_aggregate
from resfl_lightning.aggregation.krum import Krum
from resfl_lightning.aggregation.median import CoordinateMedian
from resfl_lightning.aggregation.resfl_robust import RobustResfl
from resfl_lightning.aggregation.trimmed_mean import TrimmedMean
from resfl_lightning.attacks import byzantine_vectors as V
from resfl_lightning.attacks.byzantine_round import ByzantineAttackSettings, ByzantineRound
from resfl_lightning.federation.state import FlatLayout
from resfl_lightning.types import ClientReport

MASK = torch.tensor([True] * 4 + [False] * 6)  # 4 parameters, then 6 buffer values


def reports(n: int) -> list[ClientReport]:
    return [ClientReport(client_id=i, num_samples=10, ufm_raw=0.0, ufm_ema=0.0, u=0.0, gated=False, val_utility=0.8,
                         val_utility50=0.8, eval_loss=1.0) for i in range(n)]


def round_with_flipped_attacker(n: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """(deltas[n, 10], root update): honest parameters along g0, client 0 sends their negation; every client's
    buffers are a large common shift plus its own small spread, as BatchNorm statistics are."""
    gen = torch.Generator().manual_seed(0)
    g0 = torch.tensor([1.0, 0.5, -0.5, 0.25])
    params = g0 + 0.1 * torch.randn(n, 4, generator=gen)
    params[0] = -params[0]
    buffers = 50.0 + torch.randn(n, 6, generator=gen)
    return torch.cat([params, buffers], dim=1), torch.cat([g0, torch.full((6,), 50.0)])


class Root:
    def __init__(self, g0: torch.Tensor):
        self.g0 = g0

    def update(self) -> torch.Tensor:
        return self.g0


def test_layout_mask_marks_parameters_and_not_running_statistics():
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    layout = FlatLayout.of(model)
    mask = layout.parameter_mask(model)
    expected = [k in dict(model.named_parameters()) for k in layout.float_keys for _ in range(
        math.prod(dict(model.state_dict())[k].shape))]
    assert mask.tolist() == expected and mask.sum() == 3 * 2 + 2 + 2 + 2 and (~mask).sum() == 4


def test_fltrust_distrusts_the_flipped_update_whatever_the_buffers():
    deltas, g0 = round_with_flipped_attacker()
    rule = FLTrust()
    rule.root, rule.param_mask = Root(g0), MASK
    out = rule.aggregate_round(deltas, reports(5))
    w = rule.weights(reports(5))
    assert w[0] == 0.0 and math.isclose(sum(w.values()), 1.0)
    expected, ts = fltrust_aggregate(deltas[:, MASK], g0[MASK])  # the paper's rule on the parameters
    torch.testing.assert_close(out[MASK], expected)
    shares = ts / ts.sum()
    torch.testing.assert_close(out[~MASK], (shares[:, None] * deltas[:, ~MASK].double()).sum(dim=0))
    # the defect this guards against: over the whole vector the buffers make every cosine ~1
    whole = FLTrust()
    whole.root = Root(g0)
    whole.aggregate_round(deltas, reports(5))
    assert whole.weights(reports(5))[0] > 0.15


def test_krum_picks_by_parameter_distance_and_takes_the_picks_buffers():
    gen = torch.Generator().manual_seed(1)
    params = torch.ones(5, 4) + 0.01 * torch.randn(5, 4, generator=gen)
    params[0] = -2.0  # far in parameters
    buffers = 50.0 + 20.0 * torch.randn(5, 6, generator=gen)
    buffers[0] = buffers[1:].mean(dim=0)  # the attacker's buffers sit in the middle of the others'
    deltas = torch.cat([params, buffers], dim=1)
    assert torch.equal(Krum(f=1).aggregate(deltas, reports(5)), deltas[0].double())  # whole vector: picks 0
    rule = Krum(f=1)
    rule.param_mask = MASK
    out = rule.aggregate_round(deltas, reports(5))
    pick = max(rule.weights(reports(5)).items(), key=lambda kv: kv[1])[0]
    assert pick != 0 and torch.equal(out, deltas[pick].double())


def test_coordinatewise_and_other_rules_see_every_coordinate_as_before():
    deltas, _ = round_with_flipped_attacker(7)
    for rule in (CoordinateMedian(), TrimmedMean(beta=0.2)):
        plain = rule.aggregate(deltas, reports(7))
        rule.param_mask = MASK
        assert torch.equal(rule.aggregate_round(deltas, reports(7)), plain)


def test_resfl_robust_evaluates_whole_models_but_trusts_by_parameters():
    deltas, g0 = round_with_flipped_attacker()
    seen = []

    class EvalRoot(Root):
        def evaluate(self, delta):
            seen.append(delta.numel())
            return type("E", (), {"ufm_raw": 0.5, "utility": 0.9, "ufm_se": 0.01})()

    rule = RobustResfl(f=1)
    rule.root, rule.param_mask = EvalRoot(g0), MASK
    rule.aggregate_round(deltas, reports(5))
    assert seen == [10] * 5 and rule.details["trust"][0] == 0.0 and min(rule.details["trust"][1:]) > 0.9


def test_omniscient_attacks_are_computed_on_the_coordinates_they_replace():
    deltas, _ = round_with_flipped_attacker(6)
    for kind in ("min_max", "min_sum"):
        t = ByzantineRound(6, ByzantineAttackSettings(kind=kind, fraction=0.34), seed=3, mask=MASK)
        attackers = t.attackers(0)
        honest = [i for i in range(6) if i not in attackers]
        _, out = t.round_transform(0, reports(6), deltas)
        make = V.min_max if kind == "min_max" else V.min_sum
        sent = make(deltas[honest][:, MASK]).float()
        for i in attackers:
            torch.testing.assert_close(out[i, MASK], sent)
            assert torch.equal(out[i, ~MASK], deltas[i, ~MASK])
        # over the whole vector the perturbation mu/||mu|| points along the buffers and barely moves the parameters
        whole = V.min_max(deltas[honest]) if kind == "min_max" else V.min_sum(deltas[honest])
        mu = deltas[honest][:, MASK].double().mean(dim=0)
        assert float((sent.double() - mu).norm()) > 10 * float((whole[:4] - mu).norm())
    np.testing.assert_array_equal(MASK.numpy(), [True] * 4 + [False] * 6)
