"""The comparison table's statistics (docs/method.md §11): which seeds each cell uses, the paired tests with their
corrections (Holm over the primary family, Benjamini-Hochberg over the other paired cells), FATE over seeds, the
power lines and the verdicts against the papers' claims. Settings: conf/table/statistics.yaml and claims.yaml; the
formulas are the pure functions of resfl_lightning/metrics/statistics.py. table.py reads the runs and writes files.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from resfl_lightning.analysis.columns import Fate
from resfl_lightning.analysis.verdict_index import VERDICT_HEADER
from resfl_lightning.metrics.intervals import Interval
from resfl_lightning.metrics.statistics import (
    RatioInterval,
    benjamini_hochberg,
    common_seeds,
    fate_over_seeds,
    holm,
    paired_t,
    relative_change,
    seeds_for_power,
    seeds_for_power_normal,
    t_test,
    verdict,
)
from resfl_lightning.resources import conf_dir


# --- settings ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StatisticsSettings:
    alpha: float
    confidence: float
    power: float
    baseline: str
    primary_method: str
    primary_columns: tuple[str, ...]
    map50_floor: float
    seeds: dict[str, tuple[int, int]]  # dataset ("default" for the rest) -> (seeds, primary_seeds)

    @property
    def primary_methods(self) -> tuple[str, str]:
        return self.baseline, self.primary_method

    def default_seeds(self, dataset: str) -> tuple[int, int]:
        """(seeds of every method, seeds of the primary methods) when the command line gives none."""
        return self.seeds.get(dataset, self.seeds["default"])


def _get(cfg, path: Path, key: str, kind: type | tuple[type, ...]):
    node = OmegaConf.select(cfg, key)
    if node is None or not isinstance(node, kind) or isinstance(node, bool):
        raise ValueError(f"{path}: {key}: expected {'a number' if isinstance(kind, tuple) else kind.__name__}, "
                         f"got {node!r}")
    return node


def load_statistics(path: Path | None = None) -> StatisticsSettings:
    """conf/table/statistics.yaml, checked (errors name the file and key)."""
    path = path or conf_dir() / "table" / "statistics.yaml"
    cfg = OmegaConf.load(path)
    alpha, confidence, power = (float(_get(cfg, path, k, (int, float))) for k in ("alpha", "confidence", "power"))
    for key, value in (("alpha", alpha), ("confidence", confidence), ("power", power)):
        if not 0 < value < 1:
            raise ValueError(f"{path}: {key}: must lie in (0, 1), got {value}")
    columns = OmegaConf.select(cfg, "primary.columns")
    if not OmegaConf.is_list(columns) or not columns:
        raise ValueError(f"{path}: primary.columns: expected a non-empty list of column keys, got {columns!r}")
    seeds = {}
    for name, entry in (cfg.seeds.items() if "seeds" in cfg and OmegaConf.is_dict(cfg.seeds) else []):
        n, primary = entry.get("seeds"), entry.get("primary_seeds")
        if not (isinstance(n, int) and isinstance(primary, int) and 1 <= n <= primary):
            raise ValueError(f"{path}: seeds.{name}: expected {{seeds: n, primary_seeds: m}} with 1 <= n <= m, "
                             f"got {OmegaConf.to_container(entry)}")
        seeds[str(name)] = (n, primary)
    if "default" not in seeds:
        raise ValueError(f"{path}: seeds.default: missing (the seeds of datasets not listed)")
    return StatisticsSettings(alpha, confidence, power, str(_get(cfg, path, "baseline", str)),
                              str(_get(cfg, path, "primary.method", str)), tuple(str(c) for c in columns),
                              float(_get(cfg, path, "utility_floor.map_50", (int, float))), seeds)


@dataclass(frozen=True)
class Claim:
    """A paper's claim the table tests (conf/table/claims.yaml)."""

    name: str
    kind: str  # difference | fate
    method: str
    column: str
    direction: int  # the claimed sign: -1 lower, +1 higher
    source: str
    relative: float | None = None  # the paper's effect as a fraction of the baseline's mean; None: directional only
    note: str | None = None
    chance: float | None = None  # the column's chance level: a reference whose interval holds it has nothing to lower


def load_claims(path: Path | None = None) -> list[Claim]:
    """conf/table/claims.yaml, checked (errors name the file and the claim's index)."""
    path = path or conf_dir() / "table" / "claims.yaml"
    cfg = OmegaConf.load(path)
    if "claims" not in cfg or not OmegaConf.is_list(cfg.claims):
        raise ValueError(f"{path}: claims: expected a list")
    out = []
    for i, entry in enumerate(cfg.claims):
        raw = OmegaConf.to_container(entry)
        try:
            claim = Claim(**raw)
        except TypeError as err:
            raise ValueError(f"{path}: claims[{i}]: {err}") from None
        if claim.kind not in ("difference", "fate") or claim.direction not in (-1, 1):
            raise ValueError(f"{path}: claims[{i}]: kind must be difference or fate and direction -1 or 1, got "
                             f"{claim.kind!r}, {claim.direction!r}")
        if claim.relative is not None and math.copysign(1, claim.relative) != claim.direction:
            raise ValueError(f"{path}: claims[{i}]: relative {claim.relative} has not the claimed direction")
        out.append(claim)
    return out


# --- per-seed records and cells ------------------------------------------------------------------------------------
@dataclass
class SeedRecord:
    """What one (method, seed) gives the table: each column's value or, when None, why; whether the run failed or
    fell below the utility floor; FATE's inputs (utility, EO); whether its final AIA probed ground-truth boxes; the
    groups its group metrics left out (name -> units in the test split)."""

    values: dict[str, float | None] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    failed: str | None = None
    floor: str | None = None
    no_positive: str | None = None  # every group's TPR 0 at the threshold (its threshold_rates columns say nothing)
    fate_inputs: tuple[float | None, float | None] = (None, None)
    aia_fallback: bool = False
    groups_excluded: dict[str, int] = field(default_factory=dict)  # test groups below metrics.min_group_size

    @property
    def learned_but_detected_nothing(self) -> bool:
        """Finished, above the utility floor, and TPR 0 in every group at the threshold (left_out's second case)."""
        return self.failed is None and self.floor is None and self.no_positive is not None


def failed_record(message: str) -> SeedRecord:
    return SeedRecord(failed=message)


def left_out(record: SeedRecord, column) -> str | None:
    """Why a finished run's value of `column` is not compared: "did not learn" (a gated column, below the utility
    floor) or "nothing detected" (a threshold_rates column, TPR 0 in every group); None when it is compared."""
    if column.gated and record.floor is not None:
        return "did not learn"
    if column.threshold_rates and record.no_positive is not None:
        return "nothing detected"
    return None


def compared(records: dict[int, SeedRecord], column) -> dict[int, float]:
    """seed -> value of the seeds whose run finished, has a finite value and is not left out (left_out)."""
    return {s: r.values[column.key] for s, r in records.items()
            if r.failed is None and r.values.get(column.key) is not None and left_out(r, column) is None}


@dataclass
class Cell:
    """One method x column of the table."""

    interval: Interval  # over the compared seeds
    planned: int  # seeds the method was run on
    failed: int
    not_learned: int  # seeds left out by the utility floor (gated columns) or for TPR 0 (threshold_rates columns)
    reason: str | None  # why seeds have no value (the most common reason), None when every seed has one
    greyed: Interval | None = None  # the values of the left-out runs, when no compared run has one
    greyed_why: str = "did not learn"  # why they are left out (left_out: the reason of most of them)
    diff: Interval | None = None  # paired difference to the baseline
    family: str | None = None  # "primary" (Holm) or "exploratory" (BH) for a tested difference
    p_adjusted: float = math.nan
    survives: bool = False
    fate: RatioInterval | None = None


def _cell(records: dict[int, SeedRecord], column, confidence: float) -> Cell:
    key = column.key
    values = compared(records, column)
    failed = sum(r.failed is not None for r in records.values())
    below = {s: why for s, r in records.items() if r.failed is None and (why := left_out(r, column)) is not None}
    reasons = Counter(below.get(s) or r.reasons.get(key, "no value") for s, r in records.items()
                      if r.failed is None and r.values.get(key) is None)
    greyed = None
    if not values and below:
        grey = [records[s].values.get(key) for s in below]
        if any(v is not None for v in grey):
            greyed = Interval.of(t_test(grey, confidence))
    why = Counter(below.values()).most_common(1)[0][0] if below else "did not learn"
    return Cell(Interval.of(t_test(list(values.values()), confidence)), len(records), failed, len(below),
                reasons.most_common(1)[0][0] if reasons else None, greyed, greyed_why=why)


def summarise(records: dict[str, dict[int, SeedRecord]], columns: list, settings: StatisticsSettings,
              ) -> dict[str, dict[str, Cell]]:
    """method -> column key -> Cell: intervals, paired differences to the baseline (common learned seeds), FATE, and
    each tested difference's family, adjusted p and whether it survives (apply_corrections)."""
    base = records.get(settings.baseline, {})
    out: dict[str, dict[str, Cell]] = {}
    for method, seeds in records.items():
        cells = {}
        for c in columns:
            cell = _cell(seeds, c, settings.confidence)
            if method != settings.baseline and c.paired:
                cell.diff = Interval.of(paired_t(compared(seeds, c), compared(base, c), settings.confidence))
            if isinstance(c, Fate) and method != settings.baseline:
                cell.fate = fate_of(seeds, base, c.lambda_f, settings.confidence)
            cells[c.key] = cell
        out[method] = cells
    apply_corrections(out, settings)
    return out


def fate_of(method: dict[int, SeedRecord], base: dict[int, SeedRecord], lambda_f: float,
            confidence: float) -> RatioInterval:
    """FATE over the seeds where both runs finished, learned and detected something at the threshold (a run below
    the floor, or with TPR 0 in every group, has no meaningful EO)."""
    def inputs(records, i):
        return {s: r.fate_inputs[i] for s, r in records.items()
                if r.failed is None and r.floor is None and r.no_positive is None}

    return fate_over_seeds(inputs(method, 0), inputs(base, 0), inputs(method, 1), inputs(base, 1), lambda_f,
                           confidence)


def apply_corrections(cells: dict[str, dict[str, Cell]], settings: StatisticsSettings) -> None:
    """Holm over the primary family (primary method vs baseline on the primary columns), BH over every other tested
    paired cell; sets family, p_adjusted and survives in place."""
    families: dict[str, list[Cell]] = {"primary": [], "exploratory": []}
    for method, row in cells.items():
        for key, cell in row.items():
            if cell.diff is None or cell.diff.n < 2 or math.isnan(cell.diff.p):
                continue
            primary = method == settings.primary_method and key in settings.primary_columns
            cell.family = "primary" if primary else "exploratory"
            families[cell.family].append(cell)
    for name, correct in (("primary", holm), ("exploratory", benjamini_hochberg)):
        tested = families[name]
        if not tested:
            continue
        reject, adjusted = correct([c.diff.p for c in tested], settings.alpha)
        for c, r, a in zip(tested, reject, adjusted):
            c.p_adjusted, c.survives = float(a), bool(r)


def family_sizes(cells: dict[str, dict[str, Cell]]) -> Counter:
    return Counter(c.family for row in cells.values() for c in row.values() if c.family is not None)


# --- power and verdicts --------------------------------------------------------------------------------------------
def _seeds_text(d_z: float, settings: StatisticsSettings) -> str:
    exact = seeds_for_power(d_z, settings.power, settings.alpha)
    normal = seeds_for_power_normal(d_z, settings.power, settings.alpha)
    if exact is None:
        return "no finite number of seeds (zero effect)" if math.isinf(normal) else "> 100000 seeds"
    return f"{exact} seeds (normal approximation {normal:.1f})"


def power_lines(cells: dict[str, dict[str, Cell]], columns: list, settings: StatisticsSettings) -> list[str]:
    """For each primary comparison: observed effect, SD of the paired differences, d_z, and the seeds a paired t-test
    needs for the configured power at alpha (exact noncentral t, and the normal approximation)."""
    pct = round(100 * settings.power)
    lines = ["", f"Power of the primary comparisons ({settings.primary_method} − {settings.baseline}, paired by seed): "
             f"observed effect, SD of the paired differences and the seeds a paired t-test needs for {pct} % power at "
             f"α = {settings.alpha} if the true effect were the observed one (exact: noncentral t; normal: "
             "7.85/d_z² + 1.92). The SD is itself estimated from few seeds: read the seed counts as rough.", ""]
    method = cells.get(settings.primary_method, {})
    by_key = {c.key: c for c in columns}
    for key in settings.primary_columns:
        if key not in method or key not in by_key:
            continue
        diff = method[key].diff
        header = by_key[key].header
        if diff is None or diff.n < 2:
            why = method[key].reason if diff is None or diff.n == 0 else None
            lines.append(f"- {header}: n/a ({why or 'fewer than 2 seeds where both runs have a value'})")
            continue
        if diff.std == 0:
            lines.append(f"- {header}: effect {diff.mean:+.4f} identical on all {diff.n} seeds (SD 0)")
            continue
        d_z = diff.mean / diff.std
        lines.append(f"- {header}: effect {diff.mean:+.4f}, SD {diff.std:.4f} (n = {diff.n}), d_z = {d_z:+.2f}: "
                     f"{_seeds_text(d_z, settings)}")
    return lines


@dataclass(frozen=True)
class ClaimResult:
    claim: Claim
    verdict: str
    text: str  # what was measured, with the interval and the seeds that would decide


def judge_claim(claim: Claim, records: dict[str, dict[int, SeedRecord]], cells: dict[str, dict[str, Cell]],
               columns: list, settings: StatisticsSettings) -> ClaimResult:
    """One claim's verdict (metrics/statistics.py::verdict) with the measurement it rests on."""
    by_key = {c.key: c for c in columns}
    if claim.method not in records or claim.column not in by_key:
        missing = claim.method if claim.method not in records else f"column {claim.column}"
        return ClaimResult(claim, "not run", f"the table has no {missing}")
    if claim.kind == "fate":
        fate = cells[claim.method][claim.column].fate
        if fate is None or fate.n < 2:
            return ClaimResult(claim, "not testable", f"FATE over {0 if fate is None else fate.n} common seeds")
        v = verdict(fate.low, fate.high, fate.n, None, claim.direction)
        planned = len(records[claim.method])
        text = f"FATE {fate.value:+.3f} [{fate.low:+.3f}, {fate.high:+.3f}] (n = {fate.n}" + (
            f" of {planned} seeds; the others failed, did not learn or have no value)" if fate.n < planned else ")")
        if v == "not detected" and fate.se > 0:
            text += f"; {_seeds_text(fate.value / (fate.se * math.sqrt(fate.n)), settings)} would decide"
        return ClaimResult(claim, v, text)
    a = compared(records[claim.method], by_key[claim.column])
    b = compared(records.get(settings.baseline, {}), by_key[claim.column])
    diff = paired_t(a, b, settings.confidence)
    if diff.n < 2:
        why = cells[claim.method][claim.column].reason
        return ClaimResult(claim, "not testable", f"{diff.n} seeds where both have a value"
                           + (f" ({why})" if why and diff.n == 0 else ""))
    seeds = common_seeds(a, b)
    planned = len(records[claim.method])
    judged = f"n = {diff.n}" + (f" of {planned} seeds; the others failed, did not learn or have no value"
                                if diff.n < planned else "")
    if claim.chance is not None:
        reference = t_test([b[s] for s in seeds], settings.confidence)
        if reference.low <= claim.chance <= reference.high:
            return ClaimResult(claim, "not testable", f"{settings.baseline} is at chance ({reference.mean:.4f} "
                               f"[{reference.low:.4f}, {reference.high:.4f}] holds {claim.chance}; {judged}): "
                               "nothing to lower")
    paper = None if claim.relative is None else claim.relative * float(np.mean([b[s] for s in seeds]))
    v = verdict(diff.low, diff.high, diff.n, paper, claim.direction)
    text = f"difference {diff.mean:+.4f} [{diff.low:+.4f}, {diff.high:+.4f}] ({judged})"
    rel = relative_change(a, b, settings.confidence)
    if math.isfinite(rel.value) and rel.n >= 2:
        text += f", relative {100 * rel.value:+.1f} % [{100 * rel.low:+.1f} %, {100 * rel.high:+.1f} %]"
    if paper is not None:
        text += f"; the paper's effect {100 * claim.relative:+.0f} % of the baseline mean = {paper:+.4f}"
    if v == "not detected" and diff.sd > 0:
        effect = paper if paper is not None else diff.mean
        what = "the paper's effect" if paper is not None else "the observed effect"
        text += f"; {_seeds_text(effect / diff.sd, settings)} would decide at {what}"
    return ClaimResult(claim, v, text)


def verdict_lines(records: dict[str, dict[int, SeedRecord]], cells: dict[str, dict[str, Cell]], columns: list,
                  claims: list[Claim], settings: StatisticsSettings) -> list[str]:
    """The verdicts section of table.md: one row per claim of conf/table/claims.yaml, then the claims' notes."""
    lines = ["", "Verdicts on the papers' claims (docs/method.md §11; 95 % Student-t intervals, not corrected for "
             "multiplicity): *reproduced* = the interval excludes 0 on the claimed side (and holds or exceeds the "
             "paper's effect where one is given); *not detected* = it holds 0 (and the paper's effect); *refuted* = "
             "it excludes the paper's effect or lies on the other side of 0; *direction reproduced, magnitude "
             "refuted* = it excludes 0 and the paper's effect, between the two. Claims without an effect size are "
             "directional only.", "", VERDICT_HEADER, "| --- | --- | --- | --- |"]
    notes = []
    for claim in claims:
        res = judge_claim(claim, records, cells, columns, settings)
        lines.append(f"| {claim.name} | {res.verdict} | {res.text} | {claim.source} |")
        if claim.note:
            notes.append(f"- {claim.name}: {claim.note}")
    return lines + ([""] + notes if notes else [])
