"""One inference pass over the test split per evaluation round, shared by every metric that needs predictions.

`run_evaluation_pass` runs the model once (client.test_outputs) and derives the test metrics from those outputs;
callbacks that need the same predictions (EOD) read the round's EvaluationPass instead of running the model again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resfl_lightning.metrics.eod import classification_eod, detection_eod


@dataclass(frozen=True)
class EvaluationPass:
    """The outputs of one pass of the global model over the test split, and the metrics computed from them."""

    round_idx: int
    outputs: Any  # detection: (preds, gts, mean loss, features | None); classification: TabularPredictions
    metrics: dict[str, float]
    # The decision rule the round's test fairness metrics evaluate when it is not the raw score >= tau
    # (PrivFairFL-Post's server calibration, baselines/privfairfl.py::Calibration); EOD then evaluates it too.
    decision: Any = None


def run_evaluation_pass(model: Any, loader: Any, round_idx: int) -> EvaluationPass:
    outputs = model.test_outputs(loader)
    return EvaluationPass(round_idx, outputs, model.test_metrics_from(outputs))


def eod_from_pass(model: Any, evaluation: EvaluationPass, num_groups: int, protected: int,
                  unprotected: int | None) -> dict[str, float]:
    """EOD and its four rates (metrics/eod.py) from the pass's predictions, with the model's matching settings, of
    the pass's decision rule (the calibrated one when PrivFairFL-Post attached it)."""
    if evaluation.decision is not None:
        from resfl_lightning.baselines.privfairfl import calibrated_eod

        iou = model.ufm.iou_threshold if hasattr(model, "criterion") else None
        return calibrated_eod(evaluation.outputs, evaluation.decision, num_groups, protected, unprotected, iou)
    if hasattr(model, "criterion"):  # detection: (preds, gts, ...)
        preds, gts = evaluation.outputs[0], evaluation.outputs[1]
        return detection_eod(list(zip(preds, gts)), num_groups, protected, unprotected,
                             iou_threshold=model.ufm.iou_threshold, score_threshold=model.ufm.score_threshold)
    pred = evaluation.outputs
    return classification_eod(pred.y, pred.y_pred, pred.groups, num_groups, protected, unprotected)
