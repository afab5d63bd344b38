"""`resfl train --help`: every config group and option, one line each (Hydra's hydra.help).

conf/hydra/help/resfl.yaml's template calls the `resfl_help` resolver registered here, so the listing is read from
the config folder itself and never goes stale: a group line lists its options (default marked *), an option line
shows the first line of the option file's leading comment.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

# Hydra's own settings; W&B sweep files (`wandb sweep conf/sweeps/...`); the comparison table's columns (`resfl table`);
# `resfl tune`'s grids; per-dataset tuned settings, applied by run_config/tuned.py rather than chosen
NOT_GROUPS = ("hydra", "sweeps", "table", "tune", "tuned")
WIDTH = 118


def describe(path: Path) -> str:
    """The first line of the leading comment of a config file ('' when it has none)."""
    for line in path.read_text().splitlines():
        text = line.strip()
        if not text.startswith("#"):
            break
        text = text.lstrip("#").strip()
        if text and not text.startswith("@package"):
            return text.rstrip(",:;")
    return ""


def group_defaults(conf: Path) -> dict[str, str]:
    """group -> default option from train.yaml's defaults list."""
    out = {}
    for entry in OmegaConf.load(conf / "train.yaml").defaults:
        if isinstance(entry, str) or entry is None:
            continue
        for key, value in entry.items():
            group = key.replace("optional ", "").replace("override ", "").strip()
            out[group] = "null" if value is None else str(value)
    return out


def groups_and_options(conf: Path) -> dict[str, list[str]]:
    return {d.name: sorted(p.stem for p in d.glob("*.yaml"))
            for d in sorted(conf.iterdir()) if d.is_dir() and d.name not in NOT_GROUPS}


def _clip(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


def help_text(conf: Path) -> str:
    groups, defaults = groups_and_options(conf), group_defaults(conf)
    lines = ["== Config groups (group=option; * = default) =="]
    width = max(len(g) for g in groups) + 1
    for group, options in groups.items():
        marked = [f"{o}*" if defaults.get(group) == o else o for o in options]
        default = "" if group in defaults and defaults[group] in options else f"   (default: {defaults.get(group)})"
        lines.append(f"{group + '=':<{width}} {' | '.join(marked)}{default}")  # never clipped: every option
    lines += ["", "== Options =="]
    width = max(len(f"{g}={o}") for g, opts in groups.items() for o in opts) + 2
    for group, options in groups.items():
        for o in options:
            lines.append(_clip(f"{group + '=' + o:<{width}}{describe(conf / group / f'{o}.yaml')}".rstrip()))
    return "\n".join(lines).replace("$", "$$")  # Hydra fills the template with string.Template


def register(conf: Path) -> None:
    """Register the resolver `${resfl_help:}` (idempotent)."""
    if not OmegaConf.has_resolver("resfl_help"):
        OmegaConf.register_new_resolver("resfl_help", lambda: help_text(conf))
