"""`resfl tune`'s selection rule (conf/table/tune.yaml) and how a selection joins a tuned file already there: pure
functions of per-run values, so both can be checked on hand-made numbers before any run (docs/method.md,
"Tuning budget").

Per method: among the trials that have a value on every tuning seed and LEARNED on every one (validation utility above
the table's utility floor; from rule version 3 also at least a declared fraction of the reference preset's gain over
a constant prediction on the same seed, `with_learned_floor`) and, for a method that claims fairness, whose
validation Fairness Score is at most `max_increase` above the reference's (the mean of the per-seed differences over
the reference's seeds), the highest mean validation utility wins; ties go to the trial listed first. The reference is
trial 0 (the untuned preset) on the seeds where it learned and has a Fairness Score; where it has none, the fallback
method's preset (FedAvg's in conf/table/tune.yaml) on its such seeds: a preset that predicts one class is no
yardstick for fairness (the first Adult tune; its log: docs/past-results.md, "retired")."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from resfl_lightning.run_config.tuned import override_key
from resfl_lightning.values import finite

TIE_TOLERANCE = 1e-12
THEN = "; then "  # joins the selections a tuned file's selected_by lists


@dataclass(frozen=True)
class TrialValues:
    """One trial over the tuning seeds: seed -> value (None: the run did not finish or has no value)."""

    index: int
    utility: dict[int, float | None]
    fairness: dict[int, float | None] = field(default_factory=dict)  # the constrained metric (fairness methods)
    below_floor: dict[int, str | None] = field(default_factory=dict)  # seed -> why the run did not learn (or None)
    method: str | None = None  # whose trial it is, where it is another method's (the fairness fallback)
    trivial: dict[int, float | None] = field(default_factory=dict)  # a constant predictor's validation utility


@dataclass(frozen=True)
class Reference:
    """What the fairness constraint compares against: a preset's Fairness Score on the seeds where it learned."""

    label: str  # "trial 0" or "<fallback method>'s preset"
    fairness: dict[int, float]  # seed -> value; only seeds where the preset learned and has a value


@dataclass(frozen=True)
class Selection:
    selected: int | None
    verdicts: dict[int, str]  # trial index -> "feasible" or why the rule excludes it
    reason: str  # one line: what was selected, or why nothing was
    reference: Reference | None = None  # the fairness constraint's (None: unconstrained, or no reference)


def _missing(values: dict[int, float | None], seeds: Sequence[int]) -> list[int]:
    return [s for s in seeds if finite(values.get(s)) is None]


def mean_over(values: dict[int, float | None], seeds: Sequence[int]) -> float:
    """The mean over `seeds` (NaN when a seed has no value)."""
    return math.nan if _missing(values, seeds) or not seeds else sum(values[s] for s in seeds) / len(seeds)


def learned_seeds(trial: TrialValues, seeds: Sequence[int]) -> list[int]:
    """The seeds where the trial has a utility value at or above the floor."""
    return [s for s in seeds if finite(trial.utility.get(s)) is not None and trial.below_floor.get(s) is None]


def learned_floor(reference_utility: float | None, trivial: float | None, fraction: float) -> float | None:
    """Rule version 3's floor on one seed: the constant prediction's utility plus `fraction` of the reference preset's
    gain over it; None where the reference has no value or no gain there (the table's floor alone applies)."""
    if not (finite(reference_utility) is not None and finite(trivial) is not None) or reference_utility <= trivial:
        return None
    return trivial + fraction * (reference_utility - trivial)


def with_learned_floor(trial: TrialValues, reference: TrialValues, fraction: float) -> TrialValues:
    """`trial` with rule version 3's floor added to its `below_floor`: on each seed where the reference preset gained
    g > 0 over the constant predictor (its validation utility minus `trivial`), the trial did not learn if it gained
    less than fraction x g. A seed where the reference has no value or no gain keeps the table's floor alone; a seed
    already below the table's floor keeps that reason."""
    below = dict(trial.below_floor)
    for s, u in trial.utility.items():
        trivial = trial.trivial.get(s)
        floor = learned_floor(reference.utility.get(s), trivial, fraction)
        if below.get(s) is not None or floor is None or finite(u) is None:
            continue
        gain = reference.utility[s] - trivial
        if u - trivial < fraction * gain - TIE_TOLERANCE:
            below[s] = (f"val utility {u:.3f} < {floor:.3f}: gained {u - trivial:.3f} over a "
                        f"constant prediction, less than {fraction:g} x {fallback_label(reference)}'s {gain:.3f}")
    return replace(trial, below_floor=below)


def fairness_reference(preset: TrialValues, seeds: Sequence[int],
                       fallback: TrialValues | None = None) -> Reference | None:
    """Trial 0 on the seeds where it learned and has a Fairness Score; else `fallback` (another method's preset) on
    its own such seeds; None when neither has one."""
    for label, trial in (("trial 0", preset), (fallback_label(fallback), fallback)):
        if trial is None:
            continue
        values = {s: trial.fairness[s] for s in learned_seeds(trial, seeds)
                  if finite(trial.fairness.get(s)) is not None}
        if values:
            return Reference(label, values)
    return None


def fallback_label(fallback: TrialValues | None) -> str:
    return f"{fallback.method}'s preset" if fallback is not None and fallback.method else "the fallback preset"


def fairness_increase(trial: TrialValues, reference: Reference) -> float:
    """Mean over the reference's seeds of (trial - reference), paired by seed (NaN if the trial misses one)."""
    seeds = sorted(reference.fairness)
    return mean_over({s: trial.fairness[s] - reference.fairness[s] for s in seeds
                      if finite(trial.fairness.get(s)) is not None},
                     seeds)


def verdict(trial: TrialValues, reference: Reference | None, seeds: Sequence[int], max_increase: float | None) -> str:
    """'feasible', or the first condition the trial fails."""
    missing = _missing(trial.utility, seeds)
    if missing:
        return f"excluded: no validation utility on seeds {missing}"
    below = [s for s in seeds if trial.below_floor.get(s) is not None]
    if below:
        return f"excluded: did not learn on seeds {below} ({trial.below_floor[below[0]]})"
    if max_increase is None:
        return "feasible"
    if reference is None:
        return "excluded: no Fairness Score reference (no preset learned with one)"
    missing = _missing(trial.fairness, sorted(reference.fairness))
    if missing:
        return f"excluded: no validation Fairness Score on seeds {missing}"
    increase = fairness_increase(trial, reference)
    if increase > max_increase + TIE_TOLERANCE:
        return f"excluded: validation Fairness Score {increase:+.4f} vs {reference.label} (> {max_increase:+g})"
    return "feasible"


def select_trial(trials: Sequence[TrialValues], seeds: Sequence[int], max_increase: float | None = None,
                 fallback: TrialValues | None = None) -> Selection:
    """The rule's choice among `trials` (trial 0 first), or none with the reason. `max_increase`: the fairness
    constraint of a method that claims fairness, None for the others; `fallback`: another method's preset (its
    `method` set), the reference when trial 0 has none."""
    if not trials or trials[0].index != 0:
        raise ValueError("select_trial: trials must start with trial 0, the untuned preset")
    reference = None if max_increase is None else fairness_reference(trials[0], seeds, fallback)
    verdicts = {t.index: verdict(t, reference, seeds, max_increase) for t in trials}
    feasible = [t for t in trials if verdicts[t.index] == "feasible"]
    if not feasible:
        return Selection(None, verdicts, "none selected: no trial has a value and learned on every tuning seed within "
                                         "the constraint", reference)
    best = max(mean_over(t.utility, seeds) for t in feasible)
    chosen = next(t for t in feasible if mean_over(t.utility, seeds) >= best - TIE_TOLERANCE)  # ties: listed first
    tied = sum(mean_over(t.utility, seeds) >= best - TIE_TOLERANCE for t in feasible)
    note = f" (tied with {tied - 1} other trials: the first listed)" if tied > 1 else ""
    return Selection(chosen.index, verdicts,
                     f"selected trial {chosen.index}: mean validation utility {best:.4f}{note}", reference)


def merged_tuned(existing: dict | None, selected: Sequence[str], command: str, evidence: str,
                 base: Sequence[str] | None = None) -> dict | None:
    """The tuned file to write (conf/tuned/<dataset>/<method>.yaml): the overrides the trials started from whose key
    the selected trial does not set, then the trial's; selected_by and evidence extended, never replaced. `base`: the
    overrides the trials started from (None: the existing file's, which a tune freezes as its base). So the file holds
    what the selected trial trained with, also when the trials did not start from the file (use_tuned=false). None
    when that is the preset as written (no override): a tuned file needs one."""
    old = existing or {"selected_by": "", "evidence": [], "overrides": []}
    keys = {override_key(o) for o in selected}
    start = old["overrides"] if base is None else list(base)
    overrides = [o for o in start if override_key(o) not in keys] + list(selected)
    if not overrides:
        return None
    before = old["selected_by"]
    if isinstance(before, list):
        selected_by = before if command in before else [*before, command]
    else:  # one line: the earlier selections, then this one (once: a re-run of the same command adds nothing)
        earlier = str(before).split(THEN) if before else []
        selected_by = THEN.join(earlier if command in earlier else [*earlier, command])
    return {"selected_by": selected_by, "evidence": list(dict.fromkeys([*old["evidence"], evidence])),
            "overrides": overrides}
