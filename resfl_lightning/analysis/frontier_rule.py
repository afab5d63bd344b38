"""The adversary frontier's selection rule (conf/table/adversary_frontier.yaml): pure functions of per-point
summaries, so the rule can be checked on hand-made numbers before any run (docs/method.md §2, "phi's strength").

Among the points whose mean utility reaches the floor and whose Fairness Score is no worse than the default's (the
upper end of the paired t-interval of candidate - default at most `fairness_max_upper`), the lowest mean AIA
balanced accuracy wins; ties go to the smaller lambda_priv, then to the earlier strength of the grid."""

from __future__ import annotations

import math
from dataclasses import dataclass

TIE_TOLERANCE = 1e-12


@dataclass(frozen=True)
class PointSummary:
    """One grid point over the tuning seeds."""

    strength: str
    lambda_priv: float
    strength_rank: int  # the strength's position in the grid (0 = weakest), the second tie-break
    aia: float  # mean AIA balanced accuracy (NaN: no seed has one)
    utility: float  # mean utility: accuracy, or mAP@50 for detection
    fairness_upper: float  # upper end of the paired t-interval of (this - default) Fairness Score

    @property
    def name(self) -> str:
        return f"{self.strength}, λ_priv={self.lambda_priv:g}"


@dataclass(frozen=True)
class Selection:
    selected: PointSummary | None
    verdicts: dict[str, str]  # point name -> "feasible" or why the rule excludes it
    reason: str  # one line: what was selected, or why nothing was


def utility_floor(task: str, reference: float, min_minus: float, min_times: float) -> float:
    """The utility a point's mean must reach: FedAvg's mean accuracy - min_minus (classification), or min_times x
    FedAvg's mean mAP@50 (detection)."""
    if task == "classification":
        return reference - min_minus
    if task == "detection":
        return reference * min_times
    raise ValueError(f"utility_floor: task must be classification or detection, got {task!r}")


def verdict(point: PointSummary, floor: float, fairness_max_upper: float) -> str:
    """'feasible', or the first constraint the point fails (a missing value fails)."""
    if not math.isfinite(point.aia):
        return "excluded: no AIA balanced accuracy"
    if not math.isfinite(point.utility):
        return "excluded: no utility value"
    if not math.isfinite(floor):
        return "excluded: the utility floor is undefined (no FedAvg utility)"
    if point.utility < floor:
        return f"excluded: utility {point.utility:.4f} < floor {floor:.4f}"
    if not math.isfinite(point.fairness_upper):
        return "excluded: Fairness Score interval against the default undefined (fewer than 2 paired seeds)"
    if point.fairness_upper > fairness_max_upper:
        return (f"excluded: Fairness Score vs default, interval upper end {point.fairness_upper:+.4f} > "
                f"{fairness_max_upper:+g}")
    return "feasible"


def select_point(points: list[PointSummary], floor: float, fairness_max_upper: float = 0.0) -> Selection:
    """The rule's choice among `points` (or none, with the reason)."""
    verdicts = {p.name: verdict(p, floor, fairness_max_upper) for p in points}
    feasible = [p for p in points if verdicts[p.name] == "feasible"]
    if not feasible:
        return Selection(None, verdicts, "none selected: no grid point meets both the utility and the fairness "
                                         "constraint")
    best = min(p.aia for p in feasible)
    tied = [p for p in feasible if p.aia <= best + TIE_TOLERANCE]
    chosen = min(tied, key=lambda p: (p.lambda_priv, p.strength_rank))
    note = f" (tie on AIA among {len(tied)} points: smaller λ_priv, then weaker φ)" if len(tied) > 1 else ""
    return Selection(chosen, verdicts, f"selected {chosen.name}: mean AIA balanced accuracy {chosen.aia:.4f}{note}")


def confirmation_verdict(utility: float, floor: float, aia_low: float, aia_high: float, fairness_upper: float,
                         fairness_max_upper: float) -> tuple[bool, str]:
    """Whether the confirmation seeds confirm the selection: its mean utility reaches the floor (from FedAvg on the
    same seeds), its paired AIA difference to the default lies below 0, and the upper end of its paired Fairness
    Score difference to the default is at most the margin. Returns (confirmed, the reasons)."""
    checks = [
        (math.isfinite(utility) and math.isfinite(floor) and utility >= floor,
         f"utility {utility:.4f} {'>=' if utility >= floor else '<'} floor {floor:.4f}"),
        (math.isfinite(aia_high) and aia_high < 0,
         f"AIA − default interval [{aia_low:+.4f}, {aia_high:+.4f}] {'below' if aia_high < 0 else 'not below'} 0"),
        (math.isfinite(fairness_upper) and fairness_upper <= fairness_max_upper,
         f"Fairness Score − default upper end {fairness_upper:+.4f} "
         f"{'<=' if fairness_upper <= fairness_max_upper else '>'} {fairness_max_upper:+g}"),
    ]
    return all(ok for ok, _ in checks), "; ".join(text for _, text in checks)


def default_kept_verdict(utility: float, floor: float) -> tuple[bool, str]:
    """When the rule selected RESFL's default there is no change to confirm (its paired differences to itself are 0):
    only whether the default still reaches the utility floor on the confirmation seeds."""
    ok = math.isfinite(utility) and math.isfinite(floor) and utility >= floor
    return ok, (f"the rule selected the default, so no default changes; its utility {utility:.4f} "
                f"{'>=' if ok else '<'} floor {floor:.4f} on the confirmation seeds")
