"""One inference pass over the test split per evaluation round, shared by every metric that needs predictions.

`run_evaluation_pass` runs the model once (client.test_outputs) and derives the test metrics from those outputs;
callbacks that need the same predictions (EOD) read the round's EvaluationPass instead of running the model again.
A group with fewer units on the split than `metrics.min_group_size` is left out of every group metric of the pass
(metrics/group_size.py): the metrics read `measured`, the outputs with its units marked unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from resfl_lightning.metrics.eod import classification_eod, detection_eod
from resfl_lightning.metrics.group_size import small_groups, without_groups


@dataclass(frozen=True)
class EvaluationPass:
    """The outputs of one pass of the global model over the test split, and the metrics computed from them."""

    round_idx: int
    outputs: Any  # detection: (preds, gts, mean loss, features | None); classification: TabularPredictions
    metrics: dict[str, float]
    # The decision rule the round's test fairness metrics evaluate when it is not the raw score >= tau
    # (PrivFairFL-Post's server calibration, baselines/privfairfl.py::Calibration); EOD then evaluates it too.
    decision: Any = None
    groups_excluded: Mapping[int, int] = field(default_factory=dict)  # group -> its units, below min_group_size

    @property
    def measured(self) -> Any:
        """The outputs the group metrics read: the excluded groups' units marked unknown (-1)."""
        return outputs_without_groups(self.outputs, self.groups_excluded)


def output_groups(outputs: Any) -> Any:
    """The group of every unit of a pass: the rows' (classification) or every ground-truth person's (detection)."""
    if isinstance(outputs, tuple):
        gts = outputs[1]
        return torch.cat([g["groups"].reshape(-1).long().cpu() for g in gts] or [torch.zeros(0, dtype=torch.long)])
    return outputs.groups


def outputs_without_groups(outputs: Any, excluded: Mapping[int, int]) -> Any:
    """The outputs with the excluded groups' units set to group -1 (new objects; `outputs` itself when none)."""
    if not excluded:
        return outputs
    if isinstance(outputs, tuple):
        gts = [{**g, "groups": without_groups(g["groups"], excluded)} for g in outputs[1]]
        return (outputs[0], gts, *outputs[2:])
    return replace(outputs, groups=without_groups(outputs.groups, excluded))


def run_evaluation_pass(model: Any, loader: Any, round_idx: int, min_group_size: int = 1) -> EvaluationPass:
    """The model's pass over `loader` and its metrics; groups with fewer units than min_group_size on this split are
    left out of the group metrics (1: none is, and the outputs are never read for groups)."""
    outputs = model.test_outputs(loader)
    excluded = small_groups(output_groups(outputs), min_group_size) if min_group_size > 1 else {}
    evaluation = EvaluationPass(round_idx, outputs, {}, groups_excluded=excluded)
    return replace(evaluation, metrics=model.test_metrics_from(evaluation.measured))


def kept_test_metrics(model: Any, loader: Any, min_group_size: int = 1) -> dict[str, float]:
    """model.test_metrics(loader) with the groups below min_group_size on that split left out of the group metrics."""
    if min_group_size <= 1:
        return model.test_metrics(loader)
    return run_evaluation_pass(model, loader, -1, min_group_size).metrics


def eod_from_pass(model: Any, evaluation: EvaluationPass, num_groups: int, protected: int,
                  unprotected: int | None) -> dict[str, float]:
    """EOD and its four rates (metrics/eod.py) from the pass's predictions, with the model's matching settings, of
    the pass's decision rule (the calibrated one when PrivFairFL-Post attached it)."""
    if evaluation.decision is not None:
        from resfl_lightning.baselines.privfairfl import calibrated_eod

        iou = model.ufm.iou_threshold if hasattr(model, "criterion") else None
        return calibrated_eod(evaluation.outputs, evaluation.decision, num_groups, protected, unprotected, iou,
                              excluded=evaluation.groups_excluded)
    measured = evaluation.measured
    if hasattr(model, "criterion"):  # detection: (preds, gts, ...)
        preds, gts = measured[0], measured[1]
        return detection_eod(list(zip(preds, gts)), num_groups, protected, unprotected,
                             iou_threshold=model.ufm.iou_threshold, score_threshold=model.ufm.score_threshold)
    return classification_eod(measured.y, measured.y_pred, measured.groups, num_groups, protected, unprotected)
