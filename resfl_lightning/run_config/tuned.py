"""Per-dataset settings of a method that were chosen by a pre-registered selection and confirmed on fresh seeds:
conf/tuned/<dataset>/<algorithm>.yaml, or conf/tuned/<experiment>/<algorithm>.yaml for a run of an experiment preset
that has its own folder there (a table preset tuned on its own: values tuned at another size do not carry over). A
run of that dataset and method applies the file's overrides before the user's own (which win, key by key), records
the file in `tuned_file` and prints it; `use_tuned=false` turns it off.

Why command-line overrides and not a Hydra group: a tuned file selects config groups (adversary=strong), and Hydra
forbids group overrides inside a config chosen by interpolation (${dataset}_${algorithm}); as overrides placed
before the user's, an explicit `adversary=...` or `algorithm.lambda_priv=...` of the user still decides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.resources import conf_dir

SWITCH = "use_tuned"    # use_tuned=false: the presets as written
RECORD = "tuned_file"   # the applied file, relative to conf/ (null when none applied)
FILE_KEYS = {"overrides", "evidence", "selected_by"}


@dataclass(frozen=True)
class Tuned:
    path: Path
    overrides: tuple[str, ...]


def tuned_folder(dataset: str, experiment: str | None = None, tuned_root: Path | None = None) -> Path:
    """Where a run's tuned files are: the experiment preset's own folder when it has one (even an empty one: a
    preset not yet tuned runs as written), else the dataset's. `tuned_root`: conf/tuned/."""
    tuned_root = tuned_root if tuned_root is not None else conf_dir() / "tuned"
    if experiment and (tuned_root / experiment).is_dir():
        return tuned_root / experiment
    return tuned_root / dataset


def tuned_path(dataset: str, algorithm: str, root: Path | None = None, experiment: str | None = None) -> Path:
    return tuned_folder(dataset, experiment, (root or conf_dir()) / "tuned") / f"{algorithm}.yaml"


def load_tuned(path: Path) -> Tuned:
    """The file's overrides, checked: a mapping with `overrides` (a list of key=value strings) and the provenance
    keys `selected_by` and `evidence` (what chose it, where its numbers are)."""
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{RECORD}: {path}: not valid YAML ({err})") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{RECORD}: {path}: expected a mapping with keys {sorted(FILE_KEYS)}")
    unknown, missing = set(raw) - FILE_KEYS, FILE_KEYS - set(raw)
    if unknown or missing:
        raise ConfigError(f"{RECORD}: {path}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    items = raw["overrides"]
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{RECORD}: {path}: overrides: a non-empty list of key=value strings")
    for i, item in enumerate(items):
        if not isinstance(item, str) or "=" not in item or item.split("=", 1)[0].strip() in ("", SWITCH, RECORD):
            raise ConfigError(f"{RECORD}: {path}: overrides[{i}]: expected key=value, got {item!r}")
    return Tuned(path, tuple(items))


def override_key(override: str) -> str:
    """The key an override sets: `+a.b=1`, `++a.b=1`, `~a.b` and `a.b=1` all set a.b."""
    return override.split("=", 1)[0].lstrip("+~").strip()


def switched_off(user: Sequence[str]) -> bool:
    values = [o.split("=", 1)[1].strip().lower() for o in user if "=" in o and override_key(o) == SWITCH]
    if values and values[-1] not in ("true", "false"):
        raise ConfigError(f"{SWITCH}: true or false, got {values[-1]!r}")
    return bool(values) and values[-1] == "false"


def with_tuned(user: Sequence[str], choices: Mapping[str, str | None], root: Path | None = None,
               ) -> tuple[list[str], Tuned | None, list[str]]:
    """(overrides to compose with, the applied file or None, the file's overrides that were applied).

    The file's overrides come first and only those whose key the user does not set; the user's follow unchanged."""
    if any(override_key(o) == RECORD for o in user):
        raise ConfigError(f"{RECORD}: records the tuned file a run applied and is set by it, not on the command "
                          f"line ({SWITCH}=false runs the presets as written)")
    dataset, algorithm = choices.get("dataset"), choices.get("algorithm")
    if switched_off(user) or not dataset or not algorithm:
        return list(user), None, []
    experiment = choices.get("experiment")
    path = tuned_path(str(dataset), str(algorithm), root, str(experiment) if experiment else None)
    if not path.is_file():
        return list(user), None, []
    tuned = load_tuned(path)
    own = {override_key(o) for o in user}
    applied = [o for o in tuned.overrides if override_key(o) not in own]
    if not applied:
        return list(user), None, []
    return [*applied, *user, f"{RECORD}={recorded_path(path, root)}"], tuned, applied


def recorded_path(path: Path, root: Path | None = None) -> str:
    """A file as runs and results record it, relative to the repository (e.g. conf/tuned/<dataset>/<algorithm>.yaml),
    the same from a checkout and from an installed wheel (whose conf/ lies inside the package)."""
    try:
        return str(Path(path).resolve().relative_to((root or conf_dir()).resolve().parent))
    except ValueError:  # a file outside the configuration directory: its own path
        return str(path)


def recompose(user: Sequence[str], choices: Mapping[str, str | None], compose: Callable[[list[str]], object],
              announce: Callable[[str], None] | None = None):
    """`compose(overrides)` again with the tuned file applied, or None when no file applies; `announce` gets the
    line that says which file and overrides were applied."""
    overrides, tuned, applied = with_tuned(user, choices)
    if tuned is None:
        return None
    if announce is not None:
        announce(f"tuned: {overrides[-1].split('=', 1)[1]} applied ({' '.join(applied)}); use_tuned=false turns it off")
    return compose(overrides)
