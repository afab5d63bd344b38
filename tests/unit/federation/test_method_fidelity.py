"""Method pieces as the papers define them: the hard-target evidential KL, UFM gate / EMA / group floor, the
client-state store, SAM and server SWA with its cyclical learning rate."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.detection import DetectionClient
from resfl_lightning.federation.checkpoint import ServerState
from resfl_lightning.federation.client_state import ClientStateStore
from resfl_lightning.federation.local import sam_ascent, sam_descent_point
from resfl_lightning.federation.orchestrator import Federation, FederationSettings
from resfl_lightning.losses.evidential import dirichlet_kl_uniform
from resfl_lightning.metrics.ufm import drop_small_cohorts
from resfl_lightning.models.yolo import YoloSpec
from tests.helpers import compose_config, tiny_batch

torch.set_num_threads(1)


# --- L_unc: the KL target is the anchor's hard outcome ------------------------------------------------------------
def test_kl_of_all_on_target_evidence_is_zero_with_zero_gradient():
    alpha = torch.tensor([[20.0, 1.0]], requires_grad=True)
    kl = dirichlet_kl_uniform(alpha, torch.tensor([[1.0, 0.0]]))
    (grad,) = torch.autograd.grad(kl.sum(), alpha)
    assert float(kl) == pytest.approx(0.0, abs=1e-6)
    assert torch.all(grad == 0)
    # the soft target the issue describes penalises evidence for the correct class
    assert float(dirichlet_kl_uniform(alpha.detach(), torch.tensor([[0.5, 0.5]]))) == pytest.approx(1.45, abs=0.01)


def test_detection_kl_gives_no_gradient_to_the_assigned_class_evidence():
    """Foreground anchors' KL depends on background evidence only: d KL / d person-logit == 0 everywhere."""
    torch.manual_seed(0)
    client = DetectionClient(YoloSpec(num_classes=1, scale="femto", image_size=64), 3, LossWeights(), UfmSettings(),
                             OptimSettings())
    batch = tiny_batch()
    out = client.model(batch["img"])
    scores = out["scores"].detach().requires_grad_(True)  # (B, C + 1, A): person, background
    res = client.criterion.compute({**out, "scores": scores}, batch)
    assert res.fg_unc.numel() > 0
    (grad,) = torch.autograd.grad(res.fg_unc.sum(), scores)
    assert grad[:, 0].abs().max() == 0
    assert grad[:, 1].abs().max() > 0


# --- UFM protocol details ------------------------------------------------------------------------------------------
class _Reporter(DetectionClient):
    """report_u only needs the UFM settings and the client's EMA state."""

    def __init__(self, ufm: UfmSettings):  # noqa: D107 - no detector needed
        torch.nn.Module.__init__(self)
        self.ufm, self._ufm_ema, self.relative_gate = ufm, math.nan, None


def test_gate_null_disables_the_gate():
    ema, u, gated = _Reporter(UfmSettings(gate=None, ema_decay=None)).report_u(0.7, utility=0.0)
    assert (u, gated) == (0.7, False)


def test_ema_is_on_by_default_and_smooths_the_raw_value():
    client = _Reporter(UfmSettings(gate=None))
    assert client.ufm.ema_decay == 0.9
    raws = [1.0, 3.0, 0.0]
    expected, e = [], None
    for r in raws:
        e = r if e is None else 0.9 * e + 0.1 * r
        expected.append(e)
    assert [client.report_u(r, utility=1.0)[1] for r in raws] == pytest.approx(expected)


def test_client_without_enough_groups_reports_clip_high_and_keeps_its_ema():
    client = _Reporter(UfmSettings(gate=0.3, ema_decay=0.5, clip_high=5.0))
    client.report_u(1.0, utility=0.9)
    ema, u, gated = client.report_u(math.nan, utility=0.9)
    assert (ema, u, gated) == (1.0, 5.0, False)
    _, u_custom, _ = _Reporter(UfmSettings(insufficient_groups_u=2.5)).report_u(math.nan, utility=0.9)
    assert u_custom == 2.5


def test_small_groups_are_left_out():
    ids, kept = drop_small_cohorts(torch.tensor([0, 0, 0, 1, 2, 2, -1, 1]), min_count=2)
    assert ids.tolist() == [0, 0, 0, 1, 2, 2, -1, 1] and kept == 3
    ids, kept = drop_small_cohorts(torch.tensor([0, 0, 0, 1, 2, 2, -1]), min_count=2)
    assert ids.tolist() == [0, 0, 0, -1, 2, 2, -1] and kept == 2
    assert drop_small_cohorts(torch.tensor([0, 0, 1]), min_count=2)[1] == 1


def test_tabular_client_lacking_the_minority_reports_nan_ufm():
    from resfl_lightning.clients.tabular import TabularClient
    from tests.unit.clients.test_tabular_client import NUM_FEATURES, NUM_GROUPS, toy_data

    torch.manual_seed(0)
    client = TabularClient(NUM_FEATURES, NUM_GROUPS, LossWeights(), UfmSettings(min_group_persons=10_000),
                           OptimSettings(), hidden=(8, 4))
    assert math.isnan(client.evaluate(toy_data().val_loader(0)).ufm_raw)


# --- client-local state store --------------------------------------------------------------------------------------
def test_store_spills_beyond_budget_and_reads_back(tmp_path):
    store = ClientStateStore(tmp_path, memory_budget_bytes=3 * 400)  # room for 3 states of 100 floats
    states = {i: {"w": torch.full((100,), float(i))} for i in range(10)}
    for i, st in states.items():
        store.put(i, 0, st)
    assert len(store) <= 3 and store.memory_bytes() <= 1200
    store.commit()
    for i, st in states.items():
        assert torch.equal(store.get(i)["w"], st["w"])
    assert len(store) <= 3


def test_store_resume_ignores_versions_newer_than_the_checkpoint(tmp_path):
    store = ClientStateStore(tmp_path)
    for r in range(3):
        store.put(7, r, {"w": torch.tensor([float(r)])})
        store.commit()
    resumed = ClientStateStore(tmp_path)
    resumed.restore_to(1)  # crash after the client files of round 2 but before the round-2 checkpoint
    assert float(resumed.get(7)["w"]) == 1.0
    assert resumed.get(8) is None


# --- SAM ------------------------------------------------------------------------------------------------------------
def test_sam_ascent_moves_rho_along_the_gradient_and_descent_returns():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
    (p * torch.tensor([3.0, 0.0, 4.0])).sum().backward()
    before = p.detach().clone()
    offsets = sam_ascent([p], rho=0.5)
    torch.testing.assert_close(p.detach() - before, torch.tensor([0.3, 0.0, 0.4]))
    sam_descent_point([p], offsets)
    torch.testing.assert_close(p.detach(), before)


# --- server SWA (Caldarola et al. 2022; CurvFed Algorithm 2) -------------------------------------------------------
def test_swa_cycle_learning_rate_and_averaging_rounds():
    s = FederationSettings(rounds=12, swa_start=3, swa_every=3, swa_lr_high=1.0, swa_lr_low=0.01,
                           lr_milestones=(2,), lr_gamma=0.1)
    assert [s.lr_factor(r) for r in range(3)] == pytest.approx([1.0, 1.0, 0.1])
    assert [s.lr_factor(r) for r in range(3, 9)] == pytest.approx([1.0, 0.505, 0.01] * 2)
    assert [r for r in range(12) if s.swa_cycle_end(r)] == [5, 8, 11]


def test_swa_model_is_the_average_of_cycle_end_models_and_is_the_one_evaluated():
    s = FederationSettings(rounds=8, swa_start=2, swa_every=2)
    fed = SimpleNamespace(settings=s, swa_bn_mask=None)  # no BatchNorm: every entry is averaged
    state = ServerState(round_idx=-1, theta=torch.zeros(2), int_buffers={})
    thetas = {r: torch.tensor([float(r), 2.0 * r]) for r in range(8)}
    for r in range(8):
        state = Federation._update_swa(fed, ServerState(round_idx=r, theta=thetas[r], int_buffers={},
                                                        swa=state.swa, swa_count=state.swa_count), r)
        if r < 3:
            assert state.model_theta is state.theta  # before the first cycle ends, the plain global model
    torch.testing.assert_close(state.swa, (thetas[3] + thetas[5] + thetas[7]) / 3)
    assert state.swa_count == 3 and state.model_theta is state.swa


def test_algorithm_presets_compose():
    rule = {name: compose_config(f"algorithm={name}").aggregation._target_.rsplit(".", 1)[1]
            for name in ("curvfed", "fedsam", "fedswa")}
    cf = compose_config("algorithm=curvfed").algorithm
    sam = compose_config("algorithm=fedsam").algorithm
    swa = compose_config("algorithm=fedswa").algorithm
    assert (cf.lambda_task, cf.lambda_curv, rule["curvfed"], cf.keep_best_epoch) == (0.08, 0.92, "SharpnessAware", True)
    assert cf.sam_rho > 0 and cf.swa_start is not None and cf.report_fim
    assert (rule["fedsam"], sam.sam_rho, sam.swa_start, sam.lambda_curv) == ("FedAvg", 0.05, None, 0.0)
    assert (rule["fedswa"], swa.sam_rho, swa.swa_start, swa.swa_every, swa.swa_bn_update) == ("FedAvg", 0.0, 0.75, 1,
                                                                                           True)


# --- mechanism check, UFM bootstrap SE, relative gate ----------------------------------------------------
def test_mechanism_correlation_matches_scipy_and_skips_undefined_clients():
    from scipy.stats import spearmanr

    from resfl_lightning.metrics.mechanism import ufm_fairness_correlation

    u, e = [0.1, 0.5, 0.3, 0.9, math.nan], [0.02, 0.2, 0.05, 0.1, 0.3]
    assert ufm_fairness_correlation(u, e) == pytest.approx(spearmanr(u[:4], e[:4]).statistic)
    assert math.isnan(ufm_fairness_correlation([0.1, 0.2], [0.3, 0.4]))
    assert math.isnan(ufm_fairness_correlation([0.1, 0.2, 0.3], [0.5, 0.5, 0.5]))


def test_ufm_bootstrap_se_shrinks_with_more_images_and_is_zero_without_spread():
    import numpy as np

    from resfl_lightning.metrics.ufm import ufm_bootstrap_se, ufm_from_units

    rng = np.random.default_rng(0)

    def units(n):
        return [{0: float(rng.normal(10, 2))} if i % 2 else {1: float(rng.normal(5, 2))} for i in range(n)]

    small, large = ufm_bootstrap_se(units(20), seed=1), ufm_bootstrap_se(units(500), seed=1)
    assert 0 < large < small
    flat = [{0: 10.0}, {1: 5.0}] * 10
    assert ufm_bootstrap_se(flat) == pytest.approx(0.0, abs=1e-12)
    # hand: abar = (10, 5): 1/abar = (0.1, 0.2), UFM = 0.1 / 0.15
    assert ufm_from_units(flat).ufm == pytest.approx(0.1 / (0.15 + 1e-6))


def test_relative_gate_threshold_against_scipy_mad():
    import numpy as np
    from scipy.stats import median_abs_deviation

    from resfl_lightning.metrics.ufm import relative_gate_threshold

    x = [0.31, 0.28, 0.05, 0.33, 0.30]
    assert relative_gate_threshold(x, k=2.0) == pytest.approx(np.median(x) - 2.0 * median_abs_deviation(x))
    assert relative_gate_threshold([], 3.0) is None


def test_relative_gate_is_used_instead_of_the_absolute_one():
    client = _Reporter(UfmSettings(gate=0.30, gate_mode="relative", ema_decay=None))
    assert client.report_u(0.4, utility=0.05)[2] is False  # first round: no threshold yet
    client.relative_gate = 0.1
    assert client.report_u(0.4, utility=0.05)[1:] == (5.0, True)
    assert client.report_u(0.4, utility=0.2)[1:] == (0.4, False)  # above the relative gate, below the absolute one
