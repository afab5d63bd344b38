"""The comparison table's columns, built from conf/table/columns.yaml: what one cell of a (method, seed) holds.

An entry without `_target_` is a key of the run's summary.json (Column); a `_target_` names a column derived from
several files (the FedAvg run of the same seed, the attacked runs, the wall time). A new column is one yaml entry,
or one class here (or in any importable module) plus its entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.analysis.compare import compare_runs, run_privacy_score
from resfl_lightning.analysis.run_data import load_run
from resfl_lightning.attacks.mia_keys import AUDIT_PREFIX, audit_key
from resfl_lightning.resources import conf_dir
from resfl_lightning.values import finite


@dataclass
class SeedRuns:
    """The finished run directories of one (method, seed) of a table folder: its privacy run, the baseline's privacy
    run of the same seed, and its attacked runs (attack -> directory; empty without --robustness)."""

    run_dir: Path
    baseline_dir: Path
    attacked: dict[str, Path]
    _loaded: dict[Path, dict] = field(default_factory=dict, repr=False)

    def load(self, path: Path) -> dict:
        """compare.load_run of `path`, read once."""
        if path not in self._loaded:
            self._loaded[path] = load_run(path)
        return self._loaded[path]

    @property
    def run(self) -> dict:
        return self.load(self.run_dir)


def missing_reason(summary: dict, key: str) -> str:
    """Why summary.json has no finite `key`: the reason the run recorded (callbacks/run_files.py), else absent/null."""
    reasons = summary.get("missing_reasons")
    if isinstance(reasons, dict) and key in reasons:
        return f"{key} {reasons[key]}"
    return f"no {key} in summary.json" if key not in summary else f"{key} undefined"


@dataclass(frozen=True, kw_only=True)
class Column:
    """A column: its header, the name of its values in table.csv (`key`; for this class also the summary.json key
    it reads), which direction is better, whether its paired difference to the baseline is reported, decimals,
    whether it is a fairness / privacy value that a run below the utility floor leaves uncompared (`gated`), and
    whether it is a group rate at the operating threshold that a run with TPR 0 in every group leaves uncompared
    (`threshold_rates`: ΔEOP and EOD are then 0 - 0, metrics/statistics.py::no_positive_at_threshold)."""

    header: str
    key: str
    lower_is_better: bool
    paired: bool = True
    decimals: int = 3
    gated: bool = False
    threshold_rates: bool = False

    def value(self, runs: SeedRuns) -> float | None:
        summary = runs.run.summary
        return finite(summary[self.key]) if self.key in summary else None

    def why_missing(self, runs: SeedRuns) -> str:
        """Why value(runs) is None, in a few words for the table's "n/a (reason)"."""
        return missing_reason(runs.run.summary, self.key)

    def attacks(self) -> tuple[str, ...]:
        """Attack groups whose runs this column reads besides the privacy run (trained with its `option`)."""
        return ()

    @property
    def option(self) -> str | None:
        """The table option (--robustness, --audit) that trains the runs of attacks(); None: no extra runs."""
        return None


@dataclass(frozen=True, kw_only=True)
class Utility(Column):
    """Detection mAP@50-95 (test/map), else classification accuracy (test/accuracy)."""

    def value(self, runs: SeedRuns) -> float | None:
        summary = runs.run.summary
        mean_ap = finite(summary["test/map"]) if "test/map" in summary else None
        if mean_ap is not None:
            return mean_ap
        return finite(summary["test/accuracy"]) if "test/accuracy" in summary else None

    def why_missing(self, runs: SeedRuns) -> str:
        summary = runs.run.summary
        return missing_reason(summary, "test/map" if "test/map" in summary else "test/accuracy")


@dataclass(frozen=True, kw_only=True)
class PrivacyScore(Column):
    """(MIA balanced accuracy + AIA balanced accuracy) / 2 of the run (compare.run_privacy_score)."""

    def value(self, runs: SeedRuns) -> float | None:
        return run_privacy_score(runs.run)

    def why_missing(self, runs: SeedRuns) -> str:
        summary = runs.run.summary
        keys = [k for k in ("attack/mia_success_rate", "attack/aia_balanced_accuracy")
                if finite(summary.get(k)) is None]
        return "; ".join(missing_reason(summary, k) for k in keys)


@dataclass(frozen=True, kw_only=True)
class Fate(Column):
    """FATE against the baseline (CurvFed, at its printed 10x scale): a ratio of means over the seeds both methods
    have (metrics/statistics.py::fate_over_seeds), so it has no per-seed value; `inputs` gives a run's (U, EO)."""

    lambda_f: float = 1.0

    def value(self, runs: SeedRuns) -> float | None:
        return None

    def why_missing(self, runs: SeedRuns) -> str:
        return "FATE is a ratio of means over seeds"

    def inputs(self, runs: SeedRuns) -> tuple[float | None, float | None]:
        """(utility, EO) of the run: accuracy (else mAP@50-95) and the EO gap (else ΔEOP), as compare.py reads them."""
        summary = runs.run.summary
        utility = finite(summary.get("test/accuracy"))
        utility = utility if utility is not None else finite(summary.get("test/map"))
        eo = finite(summary.get("test/eo_gap"))
        return utility, eo if eo is not None else finite(summary.get("test/delta_eop"))


@dataclass(frozen=True, kw_only=True)
class AttackedRunColumn(Column):
    """A column read from the method's run of the same seed under `attack`, which the table trains with the option
    `option` names; empty without that run."""

    attack: str

    def attacks(self) -> tuple[str, ...]:
        return (self.attack,)

    def attacked_run(self, runs: SeedRuns):
        """The finished run under `attack` (compare.load_run), or None."""
        return runs.load(runs.attacked[self.attack]) if self.attack in runs.attacked else None

    def not_run(self) -> str:
        return f"no finished {self.attack} run (--{self.option})"


@dataclass(frozen=True, kw_only=True)
class AttackedChange(AttackedRunColumn):
    """compare.compare_runs's metric `key` (ba_ad, dpa_eodd) between the privacy run and its run under `attack`;
    empty without --robustness."""

    @property
    def option(self) -> str | None:
        return "robustness"

    def value(self, runs: SeedRuns) -> float | None:
        attacked = self.attacked_run(runs)
        return None if attacked is None else compare_runs(runs.run, attacked)["metrics"][self.key]["value"]

    def why_missing(self, runs: SeedRuns) -> str:
        attacked = self.attacked_run(runs)
        if attacked is None:
            return self.not_run()
        entry = compare_runs(runs.run, attacked)["metrics"][self.key]
        return str(entry.get("reason", f"{self.key} undefined"))


@dataclass(frozen=True, kw_only=True)
class AuditValue(AttackedRunColumn):
    """A summary value (`summary_key`) of the method's membership audit of the same seed: its audit run (--audit:
    analysis/table.py ATTACK_OVERRIDES["audit"]) or, with --audit-in-run, the privacy run's own audit beside its
    shadow attack (the key's attack/mia_audit_* form); empty without either."""

    summary_key: str
    attack: str = "audit"

    @property
    def option(self) -> str | None:
        return "audit"

    def source(self, runs: SeedRuns) -> tuple[dict, str] | None:
        """(the summary that holds the audit, its key there), or None when this seed has no audit."""
        attacked = self.attacked_run(runs)
        if attacked is not None:
            return attacked.summary, self.summary_key
        in_run = runs.run.summary
        return (in_run, audit_key(self.summary_key)) if any(k.startswith(AUDIT_PREFIX) for k in in_run) else None

    def value(self, runs: SeedRuns) -> float | None:
        found = self.source(runs)
        if found is None or found[1] not in found[0]:
            return None
        return finite(found[0][found[1]])

    def why_missing(self, runs: SeedRuns) -> str:
        found = self.source(runs)
        return self.not_run() if found is None else missing_reason(*found)


@dataclass(frozen=True, kw_only=True)
class WallTime(Column):
    """Seconds the run took to train (table_wall_s.json, written by the table beside the run)."""

    def value(self, runs: SeedRuns) -> float | None:
        return float(json.loads((runs.run_dir / "table_wall_s.json").read_text())["wall_s"])


def columns_file() -> Path:
    return conf_dir() / "table" / "columns.yaml"


def load_columns(path: Path | None = None) -> list[Column]:
    """The table's columns, left to right, instantiated from the `columns` list of `path` (conf/table/columns.yaml)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    path = path or columns_file()
    entries = _section(path, "columns")
    out = []
    for i, entry in enumerate(entries):
        spec = OmegaConf.to_container(entry)
        spec.setdefault("_target_", f"{__name__}.Column")  # a plain entry is a summary.json key
        try:
            column = instantiate(spec)
        except InstantiationException as err:
            raise ValueError(f"{path}: columns[{i}]: {err}") from None
        if not isinstance(column, Column):
            raise ValueError(f"{path}: columns[{i}]: {spec['_target_']} is no {__name__}.Column")
        out.append(column)
    keys = [c.key for c in out]
    if len(set(keys)) != len(keys):
        raise ValueError(f"{path}: columns: a key appears twice in {keys}")
    return out


def load_mechanism_columns(path: Path | None = None) -> list[tuple[str, str]]:
    """(header, key) of the mechanism table (keys of metrics/mechanism.py::run_mechanism), from `mechanism`."""
    path = path or columns_file()
    return [(str(e.header), str(e.key)) for e in _section(path, "mechanism")]


def _section(path: Path, name: str):
    cfg = OmegaConf.load(path)
    if name not in cfg or not OmegaConf.is_list(cfg[name]) or not cfg[name]:
        raise ValueError(f"{path}: {name}: expected a non-empty list of columns")
    return cfg[name]
