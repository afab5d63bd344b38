"""Held-out decision options of the robustness grid (docs/robustness-protocol.md, "Held-out decision options"): keys
of conf/table/robustness.yaml `decision:` whose absence keeps the published decision rule exactly.

- `selection_seeds` / `evaluation_seeds`: each defence's worst (attack, report) cell per f/n is chosen by its mean BA
  AD on the selection seeds and its interval read on the evaluation seeds only; the max over ~27 cells' means is
  biased up on the seeds it was chosen on.
- `clean_utility_test: noninferiority` (default `interval`): criterion 3 as a one-sided paired t-test of
  d = u_defence - ratio x u_reference > 0 at alpha = 0.05, with the seeds 80 % power needs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.metrics.statistics import (
    common_seeds,
    noninferiority_t,
    one_sided_power,
    seeds_for_one_sided_power,
)

SELECTION, EVALUATION = "selection_seeds", "evaluation_seeds"
CLEAN_UTILITY_TESTS = ("interval", "noninferiority")  # interval: the published rule (95 % two-sided, >= 0)
NONINFERIORITY_ALPHA = 0.05
NONINFERIORITY_POWER = 0.8


@dataclass(frozen=True)
class HeldOut:
    selection: tuple[int, ...]
    evaluation: tuple[int, ...]

    def text(self) -> str:
        return f"chosen on seeds {_seeds_text(self.selection)}, evaluated on seeds {_seeds_text(self.evaluation)}"


def _seeds_text(seeds: tuple[int, ...]) -> str:
    return ", ".join(str(s) for s in seeds)


def _seed_list(rule: dict, key: str, least: int) -> tuple[int, ...]:
    value = rule[key]
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise ExperimentError(f"conf/table/robustness.yaml decision.{key}: a list of integer seeds, got {value!r}")
    if len(set(value)) != len(value):
        raise ExperimentError(f"conf/table/robustness.yaml decision.{key}: a seed appears twice in {value}")
    if len(value) < least:
        raise ExperimentError(f"conf/table/robustness.yaml decision.{key}: at least {least} seed(s), got {value}"
                              + (" (an interval needs 2)" if least == 2 else ""))
    return tuple(value)


def held_out_seeds(grid: dict) -> HeldOut | None:
    """The decision's selection and evaluation seeds, or None when neither key is given (the published rule)."""
    rule = grid["decision"]
    given = [k for k in (SELECTION, EVALUATION) if rule.get(k) is not None]
    if not given:
        return None
    if len(given) == 1:
        other = EVALUATION if given[0] == SELECTION else SELECTION
        raise ExperimentError(f"conf/table/robustness.yaml decision.{given[0]} is given without decision.{other}: "
                              "give both or neither")
    held = HeldOut(_seed_list(rule, SELECTION, 1), _seed_list(rule, EVALUATION, 2))
    shared = sorted(set(held.selection) & set(held.evaluation))
    if shared:
        raise ExperimentError(f"conf/table/robustness.yaml decision.{SELECTION} and decision.{EVALUATION} share seeds "
                              f"{shared}: the worst case must be evaluated on seeds it was not chosen on")
    return held


def check_seeds_run(grid: dict, seeds: list[int]) -> None:
    """Refuse a grid whose held-out decision reads seeds it does not run (before any training)."""
    held = held_out_seeds(grid)
    if held is None:
        return
    for key, wanted in ((SELECTION, held.selection), (EVALUATION, held.evaluation)):
        absent = sorted(set(wanted) - set(seeds))
        if absent:
            raise ExperimentError(f"conf/table/robustness.yaml decision.{key}: seeds {absent} are not among the "
                                  f"seeds run ({_seeds_text(tuple(seeds))}); raise the grid's `seeds` or --seeds")


def clean_utility_test(grid: dict) -> str:
    test = grid["decision"].get("clean_utility_test", "interval")
    if test not in CLEAN_UTILITY_TESTS:
        raise ExperimentError(f"conf/table/robustness.yaml decision.clean_utility_test: {test!r}; choose one of "
                              f"{', '.join(CLEAN_UTILITY_TESTS)}")
    return test


def noninferiority_text(ratio: float, reference: str) -> str:
    return (f"clean utility >= {ratio} x {reference}'s (one-sided paired t-test of the difference > 0, "
            f"alpha = {NONINFERIORITY_ALPHA}: non-inferiority)")


def noninferiority_detail(mine: dict[int, float], ref: dict[int, float], ratio: float, me: str,
                          reference: str) -> tuple[bool | None, str]:
    """(verdict, detail) of d_s = mine_s - ratio x ref_s over the seeds both have: passed when the one-sided lower
    95 % bound is > 0, FAILED when the upper one is < 0; and the seeds 80 % power needs at the observed paired SD if
    the two utilities are equal (d = (1 - ratio) x mean ref, the margin the test must resolve)."""
    seeds = common_seeds(mine, ref)
    d = [mine[s] - ratio * ref[s] for s in seeds]
    test = noninferiority_t(d, NONINFERIORITY_ALPHA)
    a, b = float(np.mean([mine[s] for s in seeds])), float(np.mean([ref[s] for s in seeds]))
    level = round(100 * (1 - NONINFERIORITY_ALPHA))
    head = f"{a:.4f} vs {b:.4f} (ratio {a / b:.4f}); {me} - {ratio} x {reference} {test.mean:+.3f}"
    if test.n < 2:
        return None, f"{head} (n={test.n}): no interval"
    head += (f", one-sided {level} % bounds [{test.low:+.3f}, {test.high:+.3f}] (the two-sided "
             f"{round(100 * (1 - 2 * NONINFERIORITY_ALPHA))} % interval), p = {test.p:.3g} (n={test.n})")
    margin = (1 - ratio) * b
    if not test.sd > 0 or not margin > 0:
        return test.verdict, f"{head}; power: n/a (no spread over seeds, or no margin)"
    d_z = margin / test.sd
    need = seeds_for_one_sided_power(d_z, NONINFERIORITY_POWER, NONINFERIORITY_ALPHA)
    power = one_sided_power(d_z, test.n, NONINFERIORITY_ALPHA)
    return test.verdict, (f"{head}; power: if {me}'s utility equals {reference}'s (d = {margin:.4f}), at the paired "
                          f"SD {test.sd:.4f} (d_z = {d_z:.2f}) {round(100 * NONINFERIORITY_POWER)} % power needs "
                          f"{need if need is not None else 'more than 100000'} seeds; these {test.n} give "
                          f"{100 * power:.0f} %")
