"""Byzantine report modes through the real round loop: each mode makes an attacker report the u it defines."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from resfl_lightning.attacks.byzantine import choose_attackers
from resfl_lightning.federation.state import FlatLayout
from tests.unit.attacks.test_attack_wiring import compose_cfg


def _same(a, b) -> bool:
    """Two reports agree on everything but wall-clock timings (NaN equals NaN)."""
    fa, fb = dataclasses.asdict(a), dataclasses.asdict(b)
    fa.pop("timings"), fb.pop("timings")
    return all(fa[k] == fb[k] or (isinstance(fa[k], float) and math.isnan(fa[k]) and math.isnan(fb[k])) for k in fa)


class _Spy:
    def __init__(self):
        self.reports, self.deltas, self.theta0, self.int_buffers = {}, {}, None, None

    def on_fit_start(self, state):
        self.theta0, self.int_buffers = state.theta.clone(), dict(state.int_buffers)

    def on_client_end(self, report, delta):
        self.reports[report.client_id], self.deltas[report.client_id] = report, delta.clone()


def _one_round(tmp_path, name, *overrides):
    from resfl_lightning.builders import build_run

    cfg = compose_cfg("logger=none", "progress=false", "model.scale=femto", "dataset.num_images=40",
                      "dataset.image_size=64", "dataset.extra_reserve_images=0",
                      f"dataset.cache_dir={tmp_path / 'cache'}", "federation.rounds=1", "eval.every=100",
                      "ufm.gate_mode=absolute",  # the absolute gate the report modes are checked against
                      f"run_dir={tmp_path / name}", *overrides)
    job = build_run(cfg)
    spy = _Spy()
    job.federation.fabric._callbacks.append(spy)
    job.fit()
    torch.set_num_threads(1)
    return spy, job.federation


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("byz_report")
    byz = ["attack=byzantine", "attack.byzantine.fraction=0.5", "attack.byzantine.gamma=2.0",
           "attack.byzantine.schedule=per_round"]  # the attackers choose_attackers draws for round 0
    return {mode: _one_round(tmp, mode, *byz, f"attack.byzantine.report={mode}") for mode in ("honest", "sent", "lie")}


def test_every_mode_flips_the_same_attackers_and_honest_clients_report_alike(runs):
    attackers = choose_attackers(4, 0.5, 0, 0)
    honest = runs["honest"][0]
    for mode in ("sent", "lie"):
        spy = runs[mode][0]
        for cid in range(4):
            torch.testing.assert_close(spy.deltas[cid], honest.deltas[cid])  # the report never changes the update
            if cid not in attackers:
                assert _same(spy.reports[cid], honest.reports[cid])


def test_honest_reports_the_trained_model_and_lie_the_best_value(runs):
    attackers = choose_attackers(4, 0.5, 0, 0)
    honest, lie = runs["honest"][0], runs["lie"][0]
    clip_low = runs["lie"][1].client_factory().ufm.clip_low
    for cid in attackers:
        h, ly = honest.reports[cid], lie.reports[cid]
        assert (ly.u, ly.gated) == (clip_low, False)
        assert _same(dataclasses.replace(ly, u=h.u, gated=h.gated), h)  # otherwise the honest (trained-model) report
        assert h.gated == (h.val_utility < runs["honest"][1].client_factory().ufm.gate)


def test_sent_reports_u_and_gate_of_theta_g_plus_the_sent_update(runs):
    spy, fed = runs["sent"]
    attackers = choose_attackers(4, 0.5, 0, 0)
    client = fed.client_factory()
    layout = FlatLayout.of(client)
    for cid in attackers:
        # Independently: load theta_G + the update the server received, evaluate on the client's validation split,
        # and run the client's own EMA -> clip -> gate step from a first-round state.
        layout.load(client, spy.theta0 + spy.deltas[cid], spy.int_buffers)
        client.import_local_state(None, seed=0)
        client.begin_client(cid, 0)
        result = client.evaluate(fed.data.val_loader(cid))
        _, u, gated = client.report_u(result.ufm_raw, result.utility)
        r = spy.reports[cid]
        assert (r.gated, r.u) == (gated, pytest.approx(u))
        assert r.val_utility == pytest.approx(result.utility) and r.eval_loss == pytest.approx(result.eval_loss)
        assert math.isnan(r.ufm_raw) == math.isnan(result.ufm_raw)
        honest = runs["honest"][0].reports[cid]
        assert r.eval_loss != pytest.approx(honest.eval_loss)  # it scored the flipped model, not the trained one
