"""`resfl tune`'s selection rule (conf/table/tune.yaml) and how a selection joins a tuned file already there: pure
functions of per-run values, so both can be checked on hand-made numbers before any run (docs/method.md §5a,
"Tuning budget").

Per method: among the trials with a value on every tuning seed and, for a method that claims fairness, a validation
Fairness Score at most `max_increase` above trial 0's (the mean of the per-seed differences), the highest mean
validation utility wins; ties go to the trial listed first. Trial 0 is the untuned preset and always feasible once
complete, so the selected trial is never below it on validation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from resfl_lightning.config.tuned import override_key

TIE_TOLERANCE = 1e-12
THEN = "; then "  # joins the selections a tuned file's selected_by lists


@dataclass(frozen=True)
class TrialValues:
    """One trial over the tuning seeds: seed -> value (None: the run did not finish or has no value)."""

    index: int
    utility: dict[int, float | None]
    fairness: dict[int, float | None] = field(default_factory=dict)  # the constrained metric (fairness methods)


@dataclass(frozen=True)
class Selection:
    selected: int | None
    verdicts: dict[int, str]  # trial index -> "feasible" or why the rule excludes it
    reason: str  # one line: what was selected, or why nothing was


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def _missing(values: dict[int, float | None], seeds: Sequence[int]) -> list[int]:
    return [s for s in seeds if not _finite(values.get(s))]


def mean_over(values: dict[int, float | None], seeds: Sequence[int]) -> float:
    """The mean over `seeds` (NaN when a seed has no value)."""
    return math.nan if _missing(values, seeds) or not seeds else sum(values[s] for s in seeds) / len(seeds)


def fairness_increase(trial: TrialValues, reference: TrialValues, seeds: Sequence[int]) -> float:
    """Mean over the seeds of (trial - reference) in the constrained metric, paired by seed (NaN if one is missing)."""
    return mean_over({s: trial.fairness[s] - reference.fairness[s] for s in seeds
                      if _finite(trial.fairness.get(s)) and _finite(reference.fairness.get(s))}, seeds)


def verdict(trial: TrialValues, reference: TrialValues, seeds: Sequence[int], max_increase: float | None) -> str:
    """'feasible', or the first condition the trial fails."""
    missing = _missing(trial.utility, seeds)
    if missing:
        return f"excluded: no validation utility on seeds {missing}"
    if max_increase is None:
        return "feasible"
    missing = _missing(trial.fairness, seeds)
    if missing:
        return f"excluded: no validation Fairness Score on seeds {missing}"
    increase = fairness_increase(trial, reference, seeds)
    if increase > max_increase + TIE_TOLERANCE:
        return f"excluded: validation Fairness Score {increase:+.4f} vs trial 0 (> {max_increase:+g})"
    return "feasible"


def select_trial(trials: Sequence[TrialValues], seeds: Sequence[int], max_increase: float | None = None) -> Selection:
    """The rule's choice among `trials` (trial 0 first), or none with the reason. `max_increase`: the fairness
    constraint of a method that claims fairness, None for the others."""
    if not trials or trials[0].index != 0:
        raise ValueError("select_trial: trials must start with trial 0, the untuned preset")
    reference = trials[0]
    verdicts = {t.index: verdict(t, reference, seeds, max_increase) for t in trials}
    if verdicts[0] != "feasible":
        return Selection(None, verdicts, f"none selected: trial 0 (the untuned preset, the reference) is incomplete "
                                         f"({verdicts[0].removeprefix('excluded: ')})")
    feasible = [t for t in trials if verdicts[t.index] == "feasible"]
    best = max(mean_over(t.utility, seeds) for t in feasible)
    chosen = next(t for t in feasible if mean_over(t.utility, seeds) >= best - TIE_TOLERANCE)  # ties: listed first
    tied = sum(mean_over(t.utility, seeds) >= best - TIE_TOLERANCE for t in feasible)
    note = f" (tied with {tied - 1} other trials: the first listed)" if tied > 1 else ""
    return Selection(chosen.index, verdicts,
                     f"selected trial {chosen.index}: mean validation utility {best:.4f}{note}")


def merged_tuned(existing: dict | None, selected: Sequence[str], command: str, evidence: str) -> dict | None:
    """The tuned file to write (conf/tuned/<dataset>/<method>.yaml): the existing file's overrides whose key the
    selected trial does not set, then the trial's; selected_by and evidence extended, never replaced. None when no
    file exists and the trial sets nothing (trial 0: the preset as written needs no file)."""
    if existing is None and not selected:
        return None
    old = existing or {"selected_by": "", "evidence": [], "overrides": []}
    keys = {override_key(o) for o in selected}
    overrides = [o for o in old["overrides"] if override_key(o) not in keys] + list(selected)
    before = old["selected_by"]
    if isinstance(before, list):
        selected_by = before if command in before else [*before, command]
    else:  # one line: the earlier selections, then this one (once: a re-run of the same command adds nothing)
        earlier = str(before).split(THEN) if before else []
        selected_by = THEN.join(earlier if command in earlier else [*earlier, command])
    return {"selected_by": selected_by, "evidence": list(dict.fromkeys([*old["evidence"], evidence])),
            "overrides": overrides}
