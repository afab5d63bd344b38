"""`resfl experiment calibration`: how large each of the paper's phenomena is under FedAvg on a dataset's table
preset, against the floors a benchmark card declares (conf/table/calibration.yaml; docs/benchmark.md).

Per seed: one clean FedAvg run with the privacy attacks and the EOD measurement, and its partner attacked by the sign
flip with gamma = n/f at the declared f/n (the run that reverses the mean update: BA AD measures how much an attack
can hurt at all). A phenomenon is a final value of the clean run (or the pair's BA AD, the one definition in
analysis/robustness_results.py); the report gives its mean with the Student-t interval over the seeds, its SD,
and whether the interval clears the floor. The knobs of a preset are chosen on the calibration seeds; the check
seeds are held out for the card's numbers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.analysis.execute import Context, Experiment, PlannedRun, Report, Runs, experiment_out
from resfl_lightning.analysis.experiment import ExperimentError
from resfl_lightning.analysis.robustness_criteria import at_least
from resfl_lightning.analysis.robustness_pairing import pair_mismatch
from resfl_lightning.analysis.robustness_results import ba_ad
from resfl_lightning.analysis.robustness_results import run_values as attack_values
from resfl_lightning.analysis.table import table_preset
from resfl_lightning.data.partition import count_from_fraction
from resfl_lightning.metrics.intervals import interval_text
from resfl_lightning.metrics.statistics import TTest, t_test

BA_AD = "ba_ad"  # a phenomenon measured on the pair, not read from the clean run


@dataclass(frozen=True)
class Phenomenon:
    name: str
    key: str  # the clean run's summary key, or BA_AD
    at_least: float | None  # the floor its interval must clear (None: reported only)
    sd_at_most: float | None = None  # the largest SD across seeds it may have


@dataclass(frozen=True)
class Card:
    method: str
    seeds: list[int]
    check_seeds: list[int]
    clean: list[str]
    attacked: list[str]
    fraction: float
    phenomena: list[Phenomenon]
    paired_sd_factor: float = math.sqrt(2)  # the power lines' paired SD, as a multiple of the method's SD


def load_card(path: Path) -> Card:
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    try:
        card = Card(str(raw["method"]), [int(s) for s in raw["seeds"]], [int(s) for s in raw["check_seeds"]],
                    [str(o) for o in raw["clean"]], [str(o) for o in raw["attacked"]], float(raw["fraction"]),
                    [Phenomenon(str(name), str(p["key"]), p.get("at_least"), p.get("sd_at_most"))
                     for name, p in raw["phenomena"].items()], float(raw.get("paired_sd_factor", math.sqrt(2))))
    except (KeyError, TypeError, AttributeError) as err:
        raise ExperimentError(f"{path}: missing or malformed key {err}") from None
    if set(card.seeds) & set(card.check_seeds):
        raise ExperimentError(f"{path}: the calibration seeds and the check seeds must be disjoint")
    if not card.paired_sd_factor > 0:
        raise ExperimentError(f"{path}: paired_sd_factor must be > 0, got {card.paired_sd_factor}")
    if not 0 < card.fraction < 0.5:
        raise ExperimentError(f"{path}: fraction must lie in (0, 0.5), got {card.fraction}")
    return card


def power_lines(card: Card, dataset: str, values: dict[str, dict[int, float | None]]) -> list[str]:
    """What a comparison table on this preset can resolve: per phenomenon, the smallest method − baseline difference
    detectable at the table's seeds (conf/table/statistics.yaml) and, for each claim on that key with an effect size
    (conf/table/claims.yaml), the seeds it needs. The paired difference's SD is card.paired_sd_factor x the method's
    SD across seeds: no other method has run when the card is written."""
    from resfl_lightning.analysis.statistics import load_claims, load_statistics
    from resfl_lightning.metrics.statistics import detectable_effect, seeds_for_power

    settings, claims = load_statistics(), load_claims()
    table_seeds = sorted(set(settings.default_seeds(dataset)))
    pct = round(100 * settings.power)
    lines = ["", f"Power of a table on this preset ({pct} % power, two-sided α = {settings.alpha:g}, paired t over "
             f"seeds; the table's seeds: {' / '.join(map(str, table_seeds))}, conf/table/statistics.yaml). The paired "
             f"difference's SD is taken as {card.paired_sd_factor:.3g} × {card.method}'s SD across these seeds (two "
             "independent runs a seed; pairing by seed can only lower it). A claim with an effect size "
             "(conf/table/claims.yaml) gets the seeds it needs at that effect.", "",
             "| phenomenon | key | mean | paired SD | " + " | ".join(f"smallest difference at {n} seeds"
                                                             for n in table_seeds) + " | claims on it |",
             "| --- | --- | ---: | ---: |" + " ---: |" * len(table_seeds) + " --- |"]
    for p in card.phenomena:
        t = t_test([v for v in values[p.key].values() if v is not None])
        if p.key == BA_AD or t.n < 2:
            continue
        sd = card.paired_sd_factor * t.sd
        smallest = [f"{detectable_effect(n, settings.power, settings.alpha) * sd:.3f}" for n in table_seeds]
        said = []
        for claim in (c for c in claims if c.column == p.key):
            if claim.relative is None:
                said.append(f"{claim.name} (directional)")
                continue
            effect = claim.relative * t.mean
            needed = seeds_for_power(effect / sd, settings.power, settings.alpha) if sd > 0 else None
            said.append(f"{claim.name}: {effect:+.3f} needs {needed if needed is not None else '> 100000'} seeds")
        lines.append(f"| {p.name} | {p.key} | {t.mean:.3f} | {sd:.3f} | " + " | ".join(smallest) + " | "
                     + ("; ".join(said) or "—") + " |")
    return lines


def verdict(t: TTest, p: Phenomenon) -> str:
    """Whether the phenomenon clears its floor on these seeds: the whole interval above it, the mean only, or not."""
    if t.n < 2:
        return "n/a (fewer than 2 seeds)"
    words = []
    if p.at_least is not None:
        if at_least(t, p.at_least):
            words.append(f"clears {p.at_least:g}")
        elif t.mean >= p.at_least:
            words.append(f"mean clears {p.at_least:g}, interval does not")
        else:
            words.append(f"below {p.at_least:g}")
    if p.sd_at_most is not None:
        words.append(f"SD {'<=' if t.sd <= p.sd_at_most else '>'} {p.sd_at_most:g}")
    return "; ".join(words) or "reported"


class Calibration(Experiment):
    """The phenomena of a benchmark card under its method (FedAvg), on the card's calibration seeds or, with
    ctx.options `check`, on its held-out check seeds."""

    writer = "resfl experiment calibration"

    @functools.cached_property
    def card(self) -> Card:
        from resfl_lightning.resources import conf_dir

        return load_card(self.grid_path or conf_dir() / "table" / "calibration.yaml")

    def seeds(self, ctx: Context) -> list[int]:
        card = self.card
        return card.check_seeds if ctx.options.get("check") else card.seeds

    def default_out(self, ctx: Context) -> Path:
        return experiment_out("calibration", ctx, *(["check"] if ctx.options.get("check") else []))

    def _common(self, ctx: Context) -> list[str]:
        return [f"dataset={ctx.dataset}", f"scenario={ctx.scenario}", *table_preset(ctx.dataset, ctx.overrides),
                f"algorithm={self.card.method}"]

    def attack_overrides(self, ctx: Context) -> list[str]:
        """The attacked partner's overrides: round(f/n x n) attackers of n clients sending -(n/f) x their update."""
        from resfl_lightning.analysis.run_settings import composed_settings

        card = self.card
        n = int(composed_settings([*self._common(ctx), *ctx.overrides])["dataset"]["num_clients"])
        f = count_from_fraction(n, card.fraction)
        return [*card.attacked, f"attack.byzantine.fraction={card.fraction}", f"attack.byzantine.gamma={n / f:g}"]

    def plan(self, ctx: Context, out: Path) -> list[PlannedRun]:
        card, attacked = self.card, self.attack_overrides(ctx)
        runs = []
        for s in self.seeds(ctx):
            for kind, extra in (("clean", card.clean), ("sign_flip", attacked)):
                name = f"{kind}-s{s}"
                runs.append(PlannedRun(name, [*self._common(ctx), *extra, f"seed={s}", f"run_dir={out / name}",
                                              "logger=none", "progress=false", *ctx.overrides]))
        return runs

    def unpaired_plan(self, ctx: Context, out: Path, planned: list[PlannedRun]) -> list[str]:
        from resfl_lightning.analysis.run_settings import composed_settings

        by_name = {r.name: r for r in planned}
        s = self.seeds(ctx)[0]
        clean, attacked = (composed_settings(by_name[f"{k}-s{s}"].overrides) for k in ("clean", "sign_flip"))
        diff = pair_mismatch(clean, attacked, set())
        return [f"sign_flip-s{s}: " + "; ".join(diff[:4])] if diff else []

    def values(self, runs: Runs, seeds: list[int]) -> dict[str, dict[int, float | None]]:
        """phenomenon key -> seed -> value (None where the run did not finish or logged none)."""
        card = self.card
        out: dict[str, dict[int, float | None]] = {p.key: {} for p in card.phenomena}
        for s in seeds:
            clean, attacked = runs.get(f"clean-s{s}"), runs.get(f"sign_flip-s{s}")
            for p in card.phenomena:
                if p.key == BA_AD:
                    out[p.key][s] = ba_ad(attack_values(clean)["utility"], attack_values(attacked)["utility"])
                else:
                    out[p.key][s] = None if clean is None else clean.value(p.key)
        return out

    def report(self, ctx: Context, runs: Runs) -> Report:
        card, seeds = self.card, self.seeds(ctx)
        values = self.values(runs, seeds)
        which = "check" if ctx.options.get("check") else "calibration"
        lines = [f"# Benchmark calibration: {ctx.dataset}, scenario {ctx.scenario} ({card.method}, {len(seeds)} "
                 f"{which} seeds {seeds[0]}-{seeds[-1]}; {len(runs.planned)} runs; this invocation took "
                 f"{runs.elapsed_s:.0f} s; the runs' own wall times sum to {runs.runs_wall_s:.0f} s)", "",
                 f"Each seed: a clean {card.method} run (`{' '.join(card.clean)}`) and its partner under "
                 f"`{' '.join(self.attack_overrides(ctx))}`. Mean [95 % Student-t interval] over the seeds; SD "
                 "across seeds; a floor is cleared when the whole interval lies above it.", "",
                 "| phenomenon | key | floor | mean [95 % interval] | SD | n | verdict |",
                 "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
        for p in card.phenomena:
            t = t_test([v for v in values[p.key].values() if v is not None])
            sd = "n/a" if math.isnan(t.sd) else f"{t.sd:.3f}"
            floor = "—" if p.at_least is None else f"≥ {p.at_least:g}"
            key = "BA AD (sign flip)" if p.key == BA_AD else p.key
            lines.append(f"| {p.name} | {key} | {floor} | {interval_text(t)} | {sd} | {t.n} | {verdict(t, p)} |")
        lines += ["", "| seed | " + " | ".join(p.name for p in card.phenomena) + " |",
                  "| ---: |" + " ---: |" * len(card.phenomena)]
        for s in seeds:
            cells = ["n/a" if values[p.key][s] is None else f"{values[p.key][s]:.3f}" for p in card.phenomena]
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        lines += power_lines(card, ctx.dataset, values)
        if runs.failures:
            lines += ["", "Failed runs (re-run the same command to retry them):", "",
                      *[f"- {f}" for f in runs.failures]]
        return Report("\n".join(lines) + "\n", "calibration.md", suffix="-check" if which == "check" else "")
