"""The verdict matrix (analysis/verdict_index.py, `resfl index`): parsed from the tables' verdict sections, and the
README's copy is what the published files give."""

from __future__ import annotations

from pathlib import Path

import pytest

from resfl_lightning.analysis.verdict_index import (
    README_END,
    README_START,
    VERDICT_HEADER,
    IndexColumn,
    Verdict,
    cell_text,
    matrix_lines,
    parse_verdicts,
    readme_block,
    with_block,
)

ROOT = Path(__file__).resolve().parents[3]


def table_text(rows: list[tuple[str, str, str]], commit: str = "a" * 40) -> str:
    body = [f"| {name} | {verdict} | {measured} | some paper |" for name, verdict, measured in rows]
    return "\n".join(["# t", "", f"- commit: {commit}", "", "| method | x |", "| --- | --- |", "| fedavg | 1 |", "",
                      "Verdicts ...", "", VERDICT_HEADER, "| --- | --- | --- | --- |", *body, "", "- a note"])


def test_cells_give_the_verdict_and_the_interval_or_the_reason():
    assert cell_text(Verdict("not detected", "difference -0.0491 [-0.1026, +0.0043] (n = 10), relative -9.6 %")) == \
        "not detected: -0.049 [-0.103, +0.004], n 10"
    assert cell_text(Verdict("not detected", "FATE +1.919 [-1.783, +5.620] (n = 6 of 10 seeds; ...)")) == \
        "not detected: +1.919 [-1.783, +5.620], n 6"
    assert cell_text(Verdict("not testable", "fedavg is at chance (0.4978 [0.4945, 0.5011] holds 0.5; n = 10): x")) \
        == "not testable (fedavg is at chance)"
    assert cell_text(None) == "not in this table"


def test_matrix_rows_follow_the_claims_and_columns_follow_the_index(tmp_path):
    (tmp_path / "a.md").write_text(table_text([("c1", "reproduced", "difference -0.1000 [-0.2000, -0.0500] (n = 3)"),
                                               ("c2", "not run", "the table has no column ba_ad")], "b" * 40))
    (tmp_path / "b.md").write_text(table_text([("c2", "refuted", "difference +0.0200 [+0.0100, +0.0300] (n = 5)")]))
    lines = matrix_lines([IndexColumn("A", "a.md", "note A"), IndexColumn("B", "b.md")], tmp_path, ["c2", "c1"])
    assert lines[:4] == ["| claim | A | B |", "|---|---|---|",
                         "| c2 | not run (the table has no column ba_ad) | refuted: +0.020 [+0.010, +0.030], n 5 |",
                         "| c1 | reproduced: -0.100 [-0.200, -0.050], n 3 | not in this table |"]
    assert lines[5:] == ["- A: [a.md](a.md) (commit bbbbbbbbbbbb); note A", "- B: [b.md](b.md) (commit aaaaaaaaaaaa)"]
    with pytest.raises(FileNotFoundError, match=r"c\.md.*column 'C'"):
        matrix_lines([IndexColumn("C", "c.md")], tmp_path, ["c1"])


def test_a_file_without_verdicts_or_with_a_broken_row_is_named(tmp_path):
    with pytest.raises(ValueError, match="x.md: no verdict table"):
        parse_verdicts("# t\n", "x.md")
    broken = "\n".join([VERDICT_HEADER, "| --- |", "| c1 | reproduced |"])
    with pytest.raises(ValueError, match="y.md:3: expected 4 cells"):
        parse_verdicts(broken, "y.md")


def test_readme_block_is_replaced_between_its_markers_only():
    readme = f"top\n{README_START}\nold\n{README_END}\nbottom\n"
    block = readme_block(["| h |", "|---|", "", "- A: [a.md](a.md) (commit x)"])
    assert with_block(readme, block, "R") == f"top\n{README_START}\n| h |\n|---|\n{README_END}\nbottom\n"
    with pytest.raises(ValueError, match="R: expected one"):
        with_block("no markers", block, "R")


def test_the_readme_matrix_is_the_one_the_published_tables_give():
    """A table re-rendered without `resfl index --readme README.md`, or a cell typed by hand, fails here."""
    from resfl_lightning.analysis.statistics import load_claims
    from resfl_lightning.analysis.verdict_index import load_index

    results = ROOT / "docs" / "results"
    matrix = matrix_lines(load_index(ROOT / "conf" / "table" / "index.yaml"), results,
                          [claim.name for claim in load_claims()])
    readme = (ROOT / "README.md").read_text()
    expected = "\n".join(readme_block(matrix))
    assert expected in readme, "README's verdict matrix is stale: run `resfl index --readme README.md`"
    assert "\n".join(matrix) in (results / "index.md").read_text()


def test_resfl_index_writes_the_matrix_file_and_the_readme_block(tmp_path, monkeypatch):
    from resfl_lightning.analysis import checkout, provenance
    from resfl_lightning.cli.index import main

    for module in (checkout, provenance):  # as from a clean checkout (provenance holds its own reference)
        monkeypatch.setattr(module, "git_commit", lambda *a, **k: "c" * 40)
    (tmp_path / "a.md").write_text(table_text([("RESFL lowers the Fairness Score vs FedAvg", "reproduced",
                                                "difference -0.1000 [-0.2000, -0.0500] (n = 3)")]))
    (tmp_path / "index.yaml").write_text("columns:\n  - {header: A, file: a.md}\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# r\n{README_START}\n{README_END}\n")
    assert main(["--results-dir", str(tmp_path), "--index", str(tmp_path / "index.yaml"), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "| RESFL lowers the Fairness Score vs FedAvg | reproduced: -0.100 [-0.200, -0.050], n 3 |" in text
    assert "| RESFL lowers ΔEOP by 17 % vs FedAvg | not in this table |" in text
    index = (tmp_path / "index.md").read_text()
    assert "- command: `resfl index --results-dir" in index and f"- commit: {'c' * 40}" in index
    for module in (checkout, provenance):
        monkeypatch.setattr(module, "git_commit", lambda *a, **k: "c" * 40 + " (with uncommitted changes)")
    with pytest.raises(SystemExit, match="uncommitted changes"):
        main(["--results-dir", str(tmp_path), "--index", str(tmp_path / "index.yaml")])
