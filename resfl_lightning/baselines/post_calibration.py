"""PrivFairFL-Post's callback: fit the server-side calibration from the round's reports and re-score the test split
(and the final validation pass) with it. PrivFairFLPost.server_callbacks (algorithms/privfairfl.py) installs it."""

from __future__ import annotations

from resfl_lightning.baselines.privfairfl import (
    PostCalibrationSettings,
    calibrated_classification_metrics,
    calibrated_detection_metrics,
    fit_post_calibration,
)


class PostCalibration:
    """Runs after GlobalEvaluation: the calibration is fitted from the clients' reported counts alone (ClientReport.
    extras); on evaluation rounds the calibrated rule's fairness metrics replace the test ones (the raw ones move to
    test/uncalibrated/; the same for val/ in the last round), and the round's test pass carries the rule so that EOD
    measures it too."""

    def __init__(self, settings: PostCalibrationSettings, evaluation):
        self.settings, self.evaluation = settings, evaluation

    def on_round_end(self, federation, round_idx: int, reports, model, metrics: dict) -> None:
        if not federation.fabric.is_global_zero:
            return
        detection = hasattr(model, "criterion")
        tau = model.ufm.score_threshold if detection else 0.5  # tabular: argmax of two outcomes = p1 >= 0.5
        cal = fit_post_calibration(reports, self.settings, model.num_groups, tau)
        metrics.update(cal.as_metrics())
        evaluation = self.evaluation.evaluation_pass(round_idx)
        if evaluation is None:
            return
        self.evaluation.attach_decision(round_idx, cal)  # EOD (attacks/robustness_attacks.py) evaluates the same rule
        passes = [("test", evaluation)]
        validation = self.evaluation.validation_pass(round_idx)
        if validation is not None:  # the rule `resfl tune` selects on is the one the test metrics report
            passes.append(("val", validation))
        for split, evaluated in passes:
            for k, v in _calibrated_metrics(model, evaluated, cal, detection).items():
                key = f"{split}/{k}"
                if key in metrics:
                    metrics[f"{split}/uncalibrated/{k}"] = metrics[key]
                metrics[key] = v


def _calibrated_metrics(model, evaluation, cal, detection: bool) -> dict[str, float]:
    if detection:  # a person's threshold only decides whether it counts as found: the measured gts serve
        preds, gts = evaluation.measured[0], evaluation.measured[1]
        return calibrated_detection_metrics(preds, gts, cal, model.num_groups, model.ufm.iou_threshold)
    return calibrated_classification_metrics(evaluation.outputs, cal, evaluation.groups_excluded)
