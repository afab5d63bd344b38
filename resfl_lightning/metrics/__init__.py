"""Pure metric functions: matching, group rates, DI / EOP / EOD, UFM and cohorts, mAP, FATE, the minimum group size."""

from resfl_lightning.metrics.detection import detection_map, to_torchmetrics
from resfl_lightning.metrics.fairness import (
    abs_one_minus_di,
    classification_fairness,
    detection_fairness,
    disparate_impact,
    eo_gap,
    equal_opportunity_difference,
    equalized_odds_difference,
    fairness_score,
    group_counts,
    group_positive_rates,
    group_tpr,
    privacy_score,
)
from resfl_lightning.metrics.fate import fate
from resfl_lightning.metrics.group_size import small_groups, without_groups
from resfl_lightning.metrics.matching import match_image, match_pred_gt
from resfl_lightning.metrics.ufm import (
    ReportedUFM,
    UFMResult,
    cohorts_kmeans,
    cohorts_proxy,
    cohorts_vacuity_slices,
    drop_group_labels,
    flip_group_labels,
    reported_ufm,
    ufm_from_detections,
    ufm_from_group_evidence,
    ufm_from_samples,
)

__all__ = [
    "ReportedUFM",
    "UFMResult",
    "abs_one_minus_di",
    "classification_fairness",
    "cohorts_kmeans",
    "cohorts_proxy",
    "cohorts_vacuity_slices",
    "detection_fairness",
    "detection_map",
    "disparate_impact",
    "drop_group_labels",
    "eo_gap",
    "equal_opportunity_difference",
    "equalized_odds_difference",
    "fairness_score",
    "fate",
    "flip_group_labels",
    "group_counts",
    "group_positive_rates",
    "group_tpr",
    "match_image",
    "match_pred_gt",
    "privacy_score",
    "reported_ufm",
    "small_groups",
    "to_torchmetrics",
    "ufm_from_detections",
    "ufm_from_group_evidence",
    "ufm_from_samples",
    "without_groups",
]
