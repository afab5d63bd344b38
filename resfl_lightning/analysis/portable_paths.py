"""Paths as committed files hold them (run ledgers, results headers, tuned files): no machine's absolute paths.

A data root is written as the key a user gives, its folder's name in angle brackets (dataset.root=/data/uci/adult as
dataset.root=<adult>; docs/CONVENTIONS.md); any other path inside the checkout relative to it (runs/...,
.venv/bin/python) and one under the home folder from ~. Restoring a ledger entry puts this machine's data root back
in place of its placeholder, so that the restored config compares equal to what the command composes here.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from resfl_lightning.resources import PACKAGE_DIR

DATA_KEY = "dataset.root"
CHECKOUT = PACKAGE_DIR.parent
_PATH_CHAR = r"[\w.~/-]"  # a path's characters: a match must not start or end inside a longer path


def placeholder(root: str) -> str:
    """The placeholder of a data root: its folder's name in angle brackets."""
    return f"<{PurePosixPath(root).name}>"


def _is_path(root: str) -> bool:
    """A root written as a path (a bare folder name could be any word of a config, and stays as it is)."""
    return "/" in root and bool(PurePosixPath(root).name)


def given_roots(overrides: Iterable[str]) -> list[str]:
    """The data roots `overrides` set (`dataset.root=X`, also with a + or ++ prefix), as given."""
    out = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if sep and key.lstrip("+") == DATA_KEY and value not in ("", "null"):
            out.append(value)
    return out


def run_roots(overrides: Iterable[str], config_yaml: str | None) -> list[str]:
    """The data roots of a run: those its overrides give, else the one its saved config (config.yaml text) names
    (set through an environment variable such as ADULT_ROOT); parsed only then, as it takes ~4 ms a run."""
    given = given_roots(overrides)
    if given or not config_yaml:
        return given
    import yaml

    try:
        root = ((yaml.load(config_yaml, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {})
                .get("dataset") or {}).get("root")
    except (yaml.YAMLError, AttributeError):
        return []
    return [root] if isinstance(root, str) else []


def _replacing(places: dict[str, str], text: str) -> str:
    """`text` with every whole path in `places` (absolute path -> its portable form, "" for the checkout) replaced,
    longest first; a path below one keeps its tail (/data/adult/adult.data -> <adult>/adult.data)."""
    if not places:
        return text
    alternatives = "|".join(re.escape(p) for p in sorted(places, key=len, reverse=True))
    pattern = re.compile(rf"(?<!{_PATH_CHAR})({alternatives})(/|(?!{_PATH_CHAR}))")

    def shown(match: re.Match) -> str:
        to = places[match.group(1)]
        if match.group(2):  # a path below it: "" + tail for the checkout itself
            return f"{to}/" if to else ""
        return to or "."

    return pattern.sub(shown, text)


def portable(text: str, roots: Iterable[str] = (), checkout: Path = CHECKOUT, home: Path | None = None) -> str:
    """`text` with the data `roots` (absolute or relative) as their placeholders, paths in the checkout relative to
    it and paths in the home folder from ~."""
    home = Path(os.path.expanduser("~")) if home is None else home
    places = {str(home): "~"} if len(home.parts) > 1 else {}  # a home of "/" would take every path
    places[str(checkout)] = ""
    for root in roots:  # as given, and without a trailing slash for the paths below it
        if _is_path(root.rstrip("/")):
            places[root] = places[root.rstrip("/")] = placeholder(root.rstrip("/"))
    return _replacing(places, text)


def localised(text: str, roots: Iterable[str]) -> str:
    """`text` with each placeholder of one of this machine's data `roots` (as its command gives them) replaced by
    the root."""
    named = {placeholder(root.rstrip("/")): root for root in roots if PurePosixPath(root).name}
    if not named:
        return text
    pattern = re.compile("|".join(re.escape(p) for p in named))
    return pattern.sub(lambda m: named[m.group(0)], text)


def portable_command(argv: Sequence[str]) -> str:
    """A command line as a results header or tuned file records it (`shlex.join`, then portable)."""
    return portable(shlex.join(argv), given_roots(argv))
