"""Byzantine sign flip, l2 bounding, attacker selection and the report modes (honest | sent | lie)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resfl_lightning.attacks.byzantine import (
    attacker_report,
    byzantine_transform,
    choose_attackers,
    l2_bound,
    sign_flip,
)


def test_sign_flip_of_every_client_negates_weighted_sum():
    gen = torch.Generator().manual_seed(0)
    deltas = [torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(5)]
    weights = torch.softmax(torch.randn(5, generator=gen, dtype=torch.float64), 0)
    clean = sum(w * d for w, d in zip(weights, deltas, strict=True))
    flipped = sum(w * sign_flip(d, 1.0) for w, d in zip(weights, deltas, strict=True))
    torch.testing.assert_close(flipped, -clean)
    torch.testing.assert_close(sign_flip(deltas[0], 2.5), -2.5 * deltas[0])
    np.testing.assert_allclose(sign_flip(np.array([1.0, -2.0]), 3.0), [-3.0, 6.0])
    with pytest.raises(ValueError, match="gamma"):
        sign_flip(deltas[0], 0.0)


def test_sign_flip_on_state_dict_keeps_integer_buffers():
    sd = {"w": torch.tensor([1.0, -1.0]), "bn.num_batches_tracked": torch.tensor(3)}
    out = sign_flip(sd, 2.0)
    torch.testing.assert_close(out["w"], torch.tensor([-2.0, 2.0]))
    assert out["bn.num_batches_tracked"].item() == 3


def test_l2_bound_rescales_only_when_needed():
    gen = torch.Generator().manual_seed(1)
    d = 10 * torch.randn(100, generator=gen, dtype=torch.float64)
    bounded = l2_bound(d, 1.0)
    assert torch.linalg.vector_norm(bounded) == pytest.approx(1.0)
    # Same direction: a pure rescale, no noise added.
    torch.testing.assert_close(bounded, d / torch.linalg.vector_norm(d))
    small = 0.001 * d
    assert l2_bound(small, 1e6) is small  # already within the bound: unchanged
    # Mapping: joint norm over all floating entries.
    sd = {"a": torch.tensor([3.0]), "b": torch.tensor([4.0]), "n": torch.tensor(7)}
    out = l2_bound(sd, 1.0)
    torch.testing.assert_close(out["a"], torch.tensor([0.6]))
    torch.testing.assert_close(out["b"], torch.tensor([0.8]))
    assert out["n"].item() == 7
    with pytest.raises(ValueError, match="bound"):
        l2_bound(d, 0.0)


def test_byzantine_transform():
    d = torch.tensor([3.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(byzantine_transform(d, 2.0), torch.tensor([-6.0, -8.0], dtype=torch.float64))
    out = byzantine_transform(d, 2.0, l2_bound=5.0)
    torch.testing.assert_close(out, torch.tensor([-3.0, -4.0], dtype=torch.float64))
    assert torch.linalg.vector_norm(byzantine_transform(d, 10.0, l2_bound=2.0)) <= 2.0 + 1e-12


def test_attacker_selection():
    n, frac, seed = 10, 0.3, 42
    sets = [choose_attackers(n, frac, seed, r) for r in range(200)]
    assert all(len(s) == 3 and s == sorted(s) and len(set(s)) == 3 for s in sets)
    assert all(0 <= i < n for s in sets for i in s)
    assert choose_attackers(n, frac, seed, 7) == sets[7]  # reproducible from (seed, round)
    assert len({tuple(s) for s in sets}) > 50  # different across rounds
    assert sets != [choose_attackers(n, frac, seed + 1, r) for r in range(200)]
    counts = np.bincount([i for s in sets for i in s], minlength=n)
    assert (counts > 0).all()  # every client attacks sometimes
    assert sum(s == [0, 1, 2] for s in sets) < 10  # not always the first clients
    # Roughly uniform: each client is chosen in about 30% of rounds.
    assert np.all(np.abs(counts / 200 - frac) < 0.12)


def test_no_or_every_attacker_at_the_ends_of_the_fraction():
    assert choose_attackers(10, 0.0, 0, 0) == []
    assert choose_attackers(4, 1.0, 0, 3) == [0, 1, 2, 3]


# --- what an attacker reports (attack.byzantine.report) -------------------------------------------------------------
class _Eval:
    def __init__(self, ufm_raw: float, utility: float):
        self.ufm_raw, self.utility = ufm_raw, utility


class _Client:
    """Stand-in for the client's report_u (EMA off, clip [0, 5], gate 0.30), recording every call."""

    def __init__(self):
        self.calls = []

    def report_u(self, ufm_raw, utility):
        self.calls.append((ufm_raw, utility))
        return ufm_raw, min(max(ufm_raw, 0.0), 5.0) if utility >= 0.30 else 5.0, utility < 0.30


@pytest.mark.parametrize("mode, expected_u, expected_gated, evaluated", [
    ("honest", 0.4, False, [(0.4, 0.5)]),  # the trained (pre-flip) model's UFM
    ("sent", 5.0, True, [(1.7, 0.1)]),  # the sent model: mAP 0.1 < gate 0.30 -> u = clip_high
    ("lie", 0.0, False, [(0.4, 0.5)]),  # clip_low, never gated, whatever the honest pipeline says
])
def test_attacker_report_modes(mode, expected_u, expected_gated, evaluated):
    client, sent_calls = _Client(), []
    honest, sent = _Eval(0.4, 0.5), _Eval(1.7, 0.1)

    def validate_sent():
        sent_calls.append(1)
        return sent

    result, (_, u, gated) = attacker_report(mode, honest, validate_sent, client.report_u, clip_low=0.0)
    assert (u, gated) == (expected_u, expected_gated)
    assert client.calls == evaluated  # the EMA / clip / gate step runs once, on the reported model
    assert result is (sent if mode == "sent" else honest)
    assert len(sent_calls) == (mode == "sent")  # the sent model is evaluated only when it is what is reported
    with pytest.raises(ValueError, match="report mode"):
        attacker_report("boast", honest, validate_sent, client.report_u, clip_low=0.0)


def test_byzantine_update_reports_only_for_its_attackers():
    from resfl_lightning.attacks.robustness import ByzantineUpdate
    from resfl_lightning.attacks.settings import ByzantineSettings

    t = ByzantineUpdate(4, ByzantineSettings(fraction=0.5, report="lie"), seed=3, clip_low=0.25)
    attackers = t.attackers(0)
    for cid in range(4):
        _, (_, u, gated) = t.report(cid, 0, _Eval(2.0, 0.1), lambda: None, _Client().report_u)
        assert (u, gated) == ((0.25, False) if cid in attackers else (5.0, True))
