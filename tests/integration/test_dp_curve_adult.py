"""`resfl dp-curve --dataset adult dataset.root=...` end to end on a one-round, one-seed grid: a DP method at a finite
epsilon and at inf (clipping only) and the GroupNorm ablation train through the table's launcher, and the results
file holds each row's utility and accounting numbers; a second invocation trains nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

GRID = """methods: [fedavg_dp]
epsilon: [1, inf]
ablations: {fedavg_gn: [algorithm=fedavg_dp, algorithm.dp.enabled=false, algorithm.name=fedavg_gn]}
seeds: [0]
attack: none
confidence: 0.95
"""


def test_dp_curve_on_adult(tmp_path: Path, adult_dir: Path, monkeypatch, capsys):
    from resfl_lightning.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    grid, out = tmp_path / "grid.yaml", tmp_path / "curve"
    grid.write_text(GRID)
    argv = ["dp-curve", "--dataset", "adult", "--grid", str(grid), "--out", str(out), "--jobs", "1",
            f"dataset.root={adult_dir}", "federation.rounds=1"]
    assert main(argv) == 0
    text = (out / "dp-curve.md").read_text()
    assert "- command: `resfl dp-curve --dataset adult" in text and (out / "dp-curve.png").is_file()
    header, rows = _table(text, "| method | ε target |")
    rows = {cells[1]: cells for cells in rows}
    assert set(rows) == {"1", "∞ (clipping only)", "no DP"}
    finite, clip = (dict(zip(header, rows[key])) for key in ("1", "∞ (clipping only)"))
    summary = json.loads((out / "fedavg_dp-eps1-s0" / "summary.json").read_text())
    assert finite["z"] == f"{summary['dp/noise_multiplier']:.3g}" and float(finite["spent ε"]) <= 1.0 + 1e-9
    assert clip["z"] == "0" and clip["spent ε"] == "∞" and clip["NSR"] == "0"
    assert finite["learned"] in {"0/1", "1/1"} and clip["learned"] in {"0/1", "1/1"}
    clip_acc, gn_acc = (json.loads((out / run / "summary.json").read_text())["test/accuracy"]
                        for run in ("fedavg_dp-epsinf-s0", "fedavg_gn-s0"))
    _, shares = _table(text, "| method | / fedavg_gn |")  # the clipping-only row as a share of the ablation
    assert [cells[0] for cells in shares] == ["fedavg_dp"]
    assert shares[0][1] == f"{clip_acc / gn_acc:.3f} (n=1)"
    assert "dp/noise_multiplier" not in json.loads((out / "fedavg_gn-s0" / "summary.json").read_text())
    wall = (out / "fedavg_dp-eps1-s0" / "table_wall_s.json").stat().st_mtime
    capsys.readouterr()
    assert main(argv) == 0  # resumable: every run finished, none is trained again
    assert (out / "fedavg_dp-eps1-s0" / "table_wall_s.json").stat().st_mtime == wall


def _cells(line: str) -> list[str]:
    """A markdown table row's cells, by position (the columns are looked up by the header's names)."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else [""]


def _table(text: str, header_start: str) -> tuple[list[str], list[list[str]]]:
    """The header and the rows of the markdown table whose header line starts so (its rows run to the blank line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append(_cells(line))
    return _cells(lines[start]), body
