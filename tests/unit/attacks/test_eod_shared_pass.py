"""EOD reuses the global evaluation's pass over the test split: one inference pass per evaluation round."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from resfl_lightning.attacks.robustness_attacks import EqualizedOdds
from resfl_lightning.callbacks.evaluation import GlobalEvaluation
from resfl_lightning.federation.orchestrator import FederationSettings
from resfl_lightning.metrics.eod import detection_eod
from tests.unit.attacks.test_attack_wiring import tiny_detection_data
from tests.unit.attacks.test_attack_wiring_features import calibrated, make_client


class _Counting:
    """Counts the client's passes over the test split (every test_metrics / EOD pass goes through collect)."""

    def __init__(self, client, test_images: int):
        self.client, self.test_images, self.passes = client, test_images, 0
        self.collect = client.collect

    def __call__(self, loader, with_features: bool = False):
        self.passes += sum(len(b["image_id"]) for b in loader) == self.test_images
        return self.collect(loader, with_features)


def test_eod_uses_the_evaluation_pass_of_the_round(tmp_path, monkeypatch):
    data = tiny_detection_data(n_images=24, size=64)
    client = calibrated(make_client(), data)
    counter = _Counting(client, len(data.splits.test))
    monkeypatch.setattr(client, "collect", counter)
    fed = SimpleNamespace(fabric=SimpleNamespace(is_global_zero=True), data=data,
                          settings=FederationSettings(rounds=5, run_dir=tmp_path))
    evaluation = GlobalEvaluation(every=3)  # evaluates rounds 0, 2 and 4
    eod = EqualizedOdds(protected_group=2, evaluation=evaluation)
    client.ufm.score_threshold = 0.0  # an untrained model: keep every detection so the rates are not all zero
    metrics: dict = {}
    evaluation.on_round_end(fed, 0, client, metrics)
    eod.on_round_end(fed, 0, client, metrics)
    assert counter.passes == 1  # the EOD did not run the model again
    preds, gts, _ = counter.collect(data.test_loader())
    ref = detection_eod(list(zip(preds, gts)), 3, 2, iou_threshold=client.ufm.iou_threshold, score_threshold=0.0)
    assert metrics["test/eod"] == pytest.approx(ref["eod"])
    assert metrics["test/eod_tpr_protected"] == pytest.approx(metrics["test/tpr/2"])
    # Round 1 has no evaluation: no pass to reuse, so no EOD, and still no extra pass.
    later: dict = {}
    evaluation.on_round_end(fed, 1, client, later)
    eod.on_round_end(fed, 1, client, later)
    assert "test/eod" not in later and counter.passes == 1
    with pytest.raises(RuntimeError, match="GlobalEvaluation"):
        EqualizedOdds(protected_group=2).on_round_end(fed, 0, client, {})
