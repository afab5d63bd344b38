"""The verdict matrix: every claim of conf/table/claims.yaml against the comparison tables conf/table/index.yaml
names, read from the verdict sections those tables' own commands wrote (analysis/statistics.py::verdict_lines), so
the matrix in docs/results/index.md and the README is generated from the published files, never typed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

VERDICT_HEADER = "| claim | verdict | measured | source |"  # the verdict table's header line in a table's results
README_START = "<!-- verdict matrix: written by `resfl index`, do not edit -->"
README_END = "<!-- end of verdict matrix -->"
# "difference -0.0491 [-0.1026, +0.0043] (n = 10)..." or "FATE +1.919 [-1.783, +5.620] (n = 6 of 10 seeds..."
_EFFECT = re.compile(r"^(?:difference|FATE) ([+-]?\d+\.\d+) \[([+-]?\d+\.\d+), ([+-]?\d+\.\d+)\] \(n = (\d+)")


@dataclass(frozen=True)
class IndexColumn:
    header: str
    file: str  # relative to the results folder
    note: str | None = None


@dataclass(frozen=True)
class Verdict:
    verdict: str
    measured: str


def load_index(path: Path) -> list[IndexColumn]:
    """conf/table/index.yaml's columns, checked (errors name the file and the column's index)."""
    cfg = OmegaConf.to_container(OmegaConf.load(path))
    if not isinstance(cfg, dict) or not isinstance(cfg.get("columns"), list) or not cfg["columns"]:
        raise ValueError(f"{path}: columns: expected a non-empty list")
    out = []
    for i, entry in enumerate(cfg["columns"]):
        try:
            out.append(IndexColumn(**entry))
        except TypeError as err:
            raise ValueError(f"{path}: columns[{i}]: {err}") from None
    return out


def parse_verdicts(text: str, where: str) -> dict[str, Verdict]:
    """{claim name: its verdict and measurement} from the verdict table of a results file's text."""
    lines = text.splitlines()
    if VERDICT_HEADER not in lines:
        raise ValueError(f"{where}: no verdict table (a line '{VERDICT_HEADER}'); is it a comparison table?")
    start = lines.index(VERDICT_HEADER) + 2  # after the header and its '| --- |' line
    out = {}
    for number, line in enumerate(lines[start:], start=start + 1):
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip()[1:-1].split(" | ")]
        if len(cells) != 4:
            raise ValueError(f"{where}:{number}: expected 4 cells in a verdict row, got {len(cells)}")
        out[cells[0]] = Verdict(cells[1], cells[2])
    return out


def cell_text(found: Verdict | None) -> str:
    """One matrix cell: the verdict and the effect with its interval and seeds, or the verdict's reason in brief."""
    if found is None:
        return "not in this table"
    effect = _EFFECT.match(found.measured)
    if effect:
        mean, low, high, n = effect.groups()
        return f"{found.verdict}: {float(mean):+.3f} [{float(low):+.3f}, {float(high):+.3f}], n {n}"
    reason = found.measured.split(":")[0].split(" (")[0]
    return f"{found.verdict} ({reason})"


def _header_value(text: str, key: str) -> str:
    """The value of a results file's '- key: value' provenance line ('?' when absent)."""
    match = re.search(rf"^- {key}: (.+)$", text, flags=re.MULTILINE)
    return match.group(1) if match else "?"


def matrix_lines(columns: list[IndexColumn], results: Path, claim_names: list[str]) -> list[str]:
    """The matrix as markdown: one row per claim, one column per table, then the columns' sources and notes."""
    found, sources = [], []
    for column in columns:
        path = results / column.file
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such results file (conf/table/index.yaml column {column.header!r})")
        text = path.read_text()
        found.append(parse_verdicts(text, str(path)))
        commit = _header_value(text, "commit")[:12]
        note = f"; {column.note}" if column.note else ""
        sources.append(f"- {column.header}: [{column.file}]({column.file}) (commit {commit}){note}")
    lines = ["| claim | " + " | ".join(c.header for c in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name in claim_names:
        lines.append(f"| {name} | " + " | ".join(cell_text(f.get(name)) for f in found) + " |")
    return lines + [""] + sources


def readme_block(matrix: list[str]) -> list[str]:
    """The README's copy: the matrix's table between the markers (its sources and notes stay in index.md)."""
    return [README_START, *(line for line in matrix if line.startswith("|")), README_END]


def with_block(readme: str, block: list[str], where: str) -> str:
    """`readme` with the text between its matrix markers (inclusive) replaced by `block`."""
    if readme.count(README_START) != 1 or readme.count(README_END) != 1:
        raise ValueError(f"{where}: expected one '{README_START}' line and one '{README_END}' line")
    head, rest = readme.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    return head + "\n".join(block) + tail
