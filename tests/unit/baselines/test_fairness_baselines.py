"""L_fair (puffle_resfl / PFU-FL / PrivFairFL-Pre), PrivFairFL-Pre's pre-upload step, PrivFairFL-Post's calibration, and
that every new algorithm config composes and validates."""

from __future__ import annotations

import math

import pytest
import torch

from resfl_lightning.baselines.privfairfl import (
    CALIBRATION_KEY,
    CalibrationStatistics,
    LogitPrivacySettings,
    PerturbCalibrate,
    PostCalibrationSettings,
    calibrated_classification_metrics,
    fit_post_calibration,
    logit_layers,
)
from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.config import ConfigError
from resfl_lightning.losses.fairness import group_mean_distance
from resfl_lightning.run_config.load import load_config
from resfl_lightning.types import ClientReport
from tests.helpers import compose_config
from tests.unit.clients.test_tabular_client import toy_data

torch.set_num_threads(1)
ALGORITHMS = ("fedavg_dp", "puffle", "puffle_resfl", "pfu_fl", "privfairfl_pre", "privfairfl_post")


def test_group_mean_distance_hand_computed():
    h = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 3.0], [0.0, 5.0], [10.0, 10.0], [4.0, 0.0]],
                     requires_grad=True)
    two = group_mean_distance(h[:5], torch.tensor([0, 0, 1, 1, -1]))  # mu_0 = (1, 0), mu_1 = (0, 4)
    assert two.item() == pytest.approx(math.sqrt(17))
    three = group_mean_distance(h, torch.tensor([0, 0, 1, 1, -1, 2]))  # + mu_2 = (4, 0)
    assert three.item() == pytest.approx((math.sqrt(17) + 3.0 + math.sqrt(32)) / 3)
    two.backward()
    assert h.grad[4].abs().sum() == 0 and h.grad[0].abs().sum() > 0  # unknown-group rows take no part
    lone = group_mean_distance(h, torch.tensor([1, 1, 1, -1, -1, 1]))
    assert float(lone) == 0.0 and lone.requires_grad


def test_client_loss_adds_w_fair_times_l_fair():
    data = toy_data(batch_size=32)
    batch = next(iter(data.train_loader(0, seed=0)))
    losses = {}
    for w in (0.0, 0.5):
        torch.manual_seed(0)
        client = TabularClient(6, 3, LossWeights(lambda_priv=0.0, lambda_fair=0.0, w_fair=w), UfmSettings(),
                               OptimSettings(), hidden=(16, 8))
        client.begin_client(0, 0)
        losses[w] = float(client.training_step(batch, 0))
        fair = float(group_mean_distance(client.model(batch["x"]).features, batch["groups"]))
    assert losses[0.5] - losses[0.0] == pytest.approx(0.5 * fair, rel=1e-5)
    assert client.mean_losses()["fair"] == pytest.approx(fair, rel=1e-5)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_algorithm_configs_compose_and_validate(name):
    cfg = compose_config(f"algorithm={name}", "logger=none")
    load_config(cfg)
    rule = "uniform.Uniform" if name == "pfu_fl" else "fedavg.FedAvg"
    assert cfg.aggregation._target_ == f"resfl_lightning.aggregation.{rule}"
    if name in ("fedavg_dp", "puffle", "puffle_resfl", "pfu_fl"):
        assert cfg.algorithm.dp.max_grad_norm == 1.0 and cfg.algorithm.dp.target_delta == 1e-6
    if name in ("puffle_resfl", "pfu_fl", "privfairfl_pre"):
        assert cfg.algorithm.w_fair == 0.1
    assert compose_config(f"algorithm={name}", "dataset=adult", "logger=none").model.hidden  # every dataset


@pytest.mark.parametrize("overrides, key", [
    (["algorithm=fedavg_dp", "algorithm.dp.max_grad_norm=0"], "algorithm.dp.max_grad_norm"),
    (["algorithm=fedavg_dp", "algorithm.dp.noise_multiplier=1.0"], "algorithm.dp"),
    (["algorithm=fedavg_dp", "algorithm.sam_rho=0.05"], "algorithm.sam_rho"),
    (["algorithm=fedavg_dp", "fabric=gpu"], "fabric.precision"),
    (["algorithm=puffle", "algorithm.lambda_curv=0.1"], "algorithm.lambda_curv"),
    (["algorithm=privfairfl_post", "algorithm.post_calibration.smoothing=2"], "algorithm.post_calibration.smoothing"),
    (["algorithm=privfairfl_pre", "algorithm.logit_privacy.clip=-1"], "algorithm.logit_privacy.clip"),
])
def test_bad_baseline_settings_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(compose_config(*overrides, "logger=none"))


def test_perturb_calibrate_clips_the_logit_layer_update_and_folds_the_temperature():
    torch.manual_seed(0)
    data = toy_data(batch_size=32)
    client = TabularClient(6, 3, LossWeights(), UfmSettings(), OptimSettings(), hidden=(16, 8))
    step = PerturbCalibrate(LogitPrivacySettings(clip=0.1, noise_multiplier=0.0, calibrate=False))
    step.begin_round(client)
    start = [p.detach().clone() for p in logit_layers(client)[0].parameters()]
    with torch.no_grad():
        for p in logit_layers(client)[0].parameters():
            p.add_(torch.randn_like(p))  # a local update far larger than the clip bound
    step.before_upload(client, data.val_loader(0))
    moved = torch.cat([(p - s).reshape(-1) for p, s in zip(logit_layers(client)[0].parameters(), start)])
    assert float(moved.norm()) == pytest.approx(0.1, rel=1e-5)
    # Calibration: the folded temperature is the grid point of least validation NLL; logits become z / T.
    x = next(iter(data.val_loader(0)))["x"]
    z_before = client.model(x).logits.detach()
    cal = PerturbCalibrate(LogitPrivacySettings(clip=1e6, noise_multiplier=0.0, temperatures=(0.5, 2.0, 8.0)))
    cal.begin_round(client)
    cal.before_upload(client, data.val_loader(0))
    assert cal.last_temperature in (0.5, 2.0, 8.0)
    torch.testing.assert_close(client.model(x).logits.detach(), z_before / cal.last_temperature)


def report(client_id: int, calibration: dict[str, float]) -> ClientReport:
    return ClientReport(client_id=client_id, num_samples=10, ufm_raw=0.0, ufm_ema=0.0, u=0.0, gated=False,
                        val_utility=1.0, val_utility50=1.0, eval_loss=0.0,
                        extras={CALIBRATION_KEY: calibration})


def stats(n: float, nll: list[float], curves: dict[int, list[float]]) -> dict[str, float]:
    """A client's calibration report: NLL per temperature, per group positives reaching each raw threshold."""
    out = {"n": n, **{f"nll/{k}": v for k, v in enumerate(nll)}}
    for g, curve in curves.items():
        out[f"pos/{g}"] = curve[0]  # every positive reaches raw threshold 0
        out.update({f"pos/{g}/{k}": v for k, v in enumerate(curve)})
    return out


def test_post_calibration_from_reports_hand_computed():
    """Raw grid 0, .25, .5, .75, 1; temperatures (1, 2); tau = 0.5, which is raw 0.5 at any T.
    Summed NLL: 6 at T=1, 4.5 at T=2 -> T = 2. Summed positives: group 0 [10, 8, 8, 0, 0], group 1 [10, 5, 0, 0, 0],
    group 2 [3, 3, 3, 0, 0]; pooled TPR at raw 0.5 = (8 + 0 + 3) / 23 (the target, ~0.478). Group 1's gaps
    [.52, .02, .48, .48, .48] -> raw 0.25, i.e. calibrated t* = sigmoid(logit(.25) / 2), smoothed halfway to tau.
    Group 0's gaps [.52, .32, .32, .48, .48] tie at raw .25 and .5 -> the one nearest tau's: 0.5. Group 2 has fewer
    than min_positives (5) -> tau."""
    settings = PostCalibrationSettings(temperatures=(1.0, 2.0), num_thresholds=5, smoothing=0.5, min_positives=5)
    a = stats(4.0, [3.0, 2.0], {0: [6, 5, 5, 0, 0], 1: [5, 2, 0, 0, 0], 2: [2, 2, 2, 0, 0]})
    b = stats(4.0, [3.0, 2.5], {0: [4, 3, 3, 0, 0], 1: [5, 3, 0, 0, 0], 2: [1, 1, 1, 0, 0]})
    cal = fit_post_calibration([report(0, a), report(1, b)], settings, num_groups=3, tau=0.5)
    assert cal.temperature == 2.0
    t_star = 1 / (1 + math.exp(-math.log(0.25 / 0.75) / 2))
    assert cal.thresholds[1] == pytest.approx(0.5 * 0.5 + 0.5 * t_star)
    assert cal.thresholds[0] == pytest.approx(0.5)
    assert cal.thresholds[2] == 0.5
    with pytest.raises(ValueError, match=r"clients \[1\]"):
        fit_post_calibration([report(0, a), report(1, {})], settings, num_groups=3, tau=0.5)


def test_temperature_alone_keeps_the_detection_operating_point():
    """Detection at tau = 0.25 with a fitted T != 1: when every group already sits at the pooled TPR, the calibrated
    rule must find exactly the persons the raw rule finds. Before the fix the calibrated scores were compared with
    raw tau itself: at T = 0.5 a raw 0.3 becomes 0.155 < 0.25 and the rule found no one (TPR 0 for every group)."""
    from resfl_lightning.baselines.privfairfl import calibrated_detection_metrics
    from resfl_lightning.metrics.fairness import detection_fairness

    settings = PostCalibrationSettings(temperatures=(0.5,), num_thresholds=101, smoothing=0.5, min_positives=1)
    # both groups: 4 positives, matched raw scores 0.6, 0.3, 0.2, 0.1 -> the same reach at every raw threshold
    grid = [i / 100 for i in range(101)]
    curve = [float(sum(s >= t - 1e-12 for s in (0.6, 0.3, 0.2, 0.1))) for t in grid]
    st = stats(8.0, [1.0], {0: curve, 1: curve})
    cal = fit_post_calibration([report(0, st)], settings, num_groups=2, tau=0.25)
    assert cal.temperature == 0.5
    tau_cal = 1 / (1 + math.exp(-math.log(0.25 / 0.75) / 0.5))
    assert cal.default == pytest.approx(tau_cal) and cal.thresholds[0] == pytest.approx(tau_cal)

    box = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    preds, gts = [], []
    for g in (0, 1):
        for score in (0.6, 0.3, 0.2, 0.1):
            preds.append({"boxes": box, "scores": torch.tensor([score]), "labels": torch.tensor([0])})
            gts.append({"boxes": box, "labels": torch.tensor([0]), "groups": torch.tensor([g])})
    raw = detection_fairness(list(zip(preds, gts)), 2, iou_threshold=0.5, score_threshold=0.25)
    calibrated = calibrated_detection_metrics(preds, gts, cal, 2, 0.5)
    assert (raw["tpr/0"], raw["tpr/1"]) == (0.5, 0.5)
    assert (calibrated["tpr/0"], calibrated["tpr/1"]) == (0.5, 0.5)


def test_post_calibration_uses_reports_only_and_narrows_the_tpr_spread():
    """Clients report aggregate counts; the server's rule, applied to the test split, lowers delta-EOP on data where
    the base rates differ by group (toy_data's labels depend on the group)."""
    torch.manual_seed(0)
    data = toy_data(batch_size=32)
    client = TabularClient(6, 3, LossWeights(lambda_priv=0.0, lambda_fair=0.0), UfmSettings(), OptimSettings(lr=0.05),
                           hidden=(16, 8))
    opt = client.configure_optimizers()
    client.train()
    for epoch in range(15):
        for batch in data.train_loader(0, seed=epoch):
            loss = client.training_step(batch, 0)
            opt.zero_grad()
            loss.backward()
            opt.step()
    settings = PostCalibrationSettings(smoothing=1.0, min_positives=5)
    stats = CalibrationStatistics(settings)
    reports = [report(i, stats.report(client, data.val_loader(i))[CALIBRATION_KEY]) for i in range(2)]
    assert all(set(r.extras[CALIBRATION_KEY]) >= {"n", "nll/0", "pos/0", "pos/0/0"} for r in reports)
    cal = fit_post_calibration(reports, settings, num_groups=3, tau=0.5)
    pred = client.test_outputs(data.test_loader())
    raw = client.test_metrics_from(pred)
    calibrated = calibrated_classification_metrics(pred, cal)
    assert calibrated["delta_eop"] < raw["delta_eop"]


# --- PrivFairFL-Post: EOD measures the calibrated rule, like the other fairness metrics --------------------------
def _det(score: float | list[float], gt_group: int, extra_box: bool = False):
    scores = [score] if isinstance(score, float) else score
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0]] + ([[50.0, 50.0, 60.0, 60.0]] if extra_box else []))
    pred = {"boxes": boxes, "scores": torch.tensor(scores), "labels": torch.zeros(len(scores), dtype=torch.long)}
    gt = {"boxes": torch.tensor([[0.0, 0.0, 10.0, 10.0]]), "labels": torch.tensor([0]),
          "groups": torch.tensor([gt_group])}
    return pred, gt


def test_group_thresholds_hand_case():
    """Persons: group 0 matched at 0.4 (t_0 = 0.3: found), group 1 matched at 0.4 and 0.2 (t_1 = 0.5: both missed);
    the last image also has an unmatched 0.3 detection, below the false-positive threshold 0.35."""
    from resfl_lightning.metrics.eod import detection_group_rates

    pairs = [_det(0.4, 0), _det(0.4, 1), _det([0.2, 0.3], 1, extra_box=True)]
    c = detection_group_rates(pairs, 2, 0.5, score_threshold=0.35, group_thresholds=[0.3, 0.5])
    assert c["tp"].tolist() == [1, 0] and c["fn"].tolist() == [0, 2]
    assert c["has_fp"].tolist() == [False, False, False]
    assert detection_group_rates(pairs, 2, 0.5, score_threshold=0.25, group_thresholds=[0.3, 0.5])["has_fp"].tolist() \
        == [False, False, True]
    with pytest.raises(ValueError, match="group_thresholds has 1 entries, expected 2"):
        detection_group_rates(pairs, 2, 0.5, group_thresholds=[0.3])


def test_eod_of_a_pass_with_a_calibration_measures_the_calibrated_rule():
    """Before the fix EOD always measured the raw rule (on Adult PrivFairFL-Post's EOD equalled FedAvg's exactly)."""
    from types import SimpleNamespace

    from resfl_lightning.baselines.privfairfl import Calibration
    from resfl_lightning.callbacks.evaluation import GlobalEvaluation
    from resfl_lightning.evaluation.evaluation_pass import EvaluationPass, eod_from_pass
    from resfl_lightning.metrics.eod import classification_eod

    p1 = torch.tensor([0.9, 0.45, 0.3, 0.6, 0.45, 0.2, 0.7, 0.1])
    outputs = SimpleNamespace(probs=torch.stack([1 - p1, p1], 1), y=torch.tensor([1, 1, 0, 0, 1, 1, 0, 0]),
                              groups=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), y_pred=(p1 >= 0.5).long())
    cal = Calibration(temperature=1.0, thresholds={0: 0.5, 1: 0.4}, default=0.5)
    model = SimpleNamespace()  # tabular: no detection criterion
    evaluation = GlobalEvaluation(every=1)
    evaluation.latest = EvaluationPass(3, outputs, {})
    raw = eod_from_pass(model, evaluation.latest, 2, protected=1, unprotected=None)
    assert raw == classification_eod(outputs.y, outputs.y_pred, outputs.groups, 2, 1)
    evaluation.attach_decision(2, cal)  # another round: nothing attached
    assert evaluation.latest.decision is None
    evaluation.attach_decision(3, cal)
    calibrated = eod_from_pass(model, evaluation.latest, 2, protected=1, unprotected=None)
    # by hand: group 1 now predicts 1 at p >= 0.4 -> y_hat = [.., 1, 0, 1, 0]; group 0 unchanged
    y_hat = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0])
    assert calibrated == classification_eod(outputs.y, y_hat, outputs.groups, 2, 1)
    assert calibrated["tpr_protected"] == 0.5 and raw["tpr_protected"] == 0.0
