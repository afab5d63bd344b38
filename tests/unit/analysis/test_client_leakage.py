"""Which client leaks most against which client the server weighted most (metrics/client_leakage.py and the section
`resfl table` writes from it), on hand cases."""

from __future__ import annotations

import json
import math

import pytest

from resfl_lightning.analysis.client_leakage_section import client_leakage_lines
from resfl_lightning.metrics.client_leakage import (
    hit_pvalue,
    most_weighted_client,
    summed_weights,
    worst_is_most_weighted,
)

ROWS = [
    {"round": 0, "client/0/weight": 0.5, "client/1/weight": 0.3, "client/2/weight": 0.2},
    {"round": 1, "client/0/weight": 0.1, "client/1/weight": 0.5, "client/2/weight": 0.4},
    {"round": 2, "client/0/weight": 0.2, "client/1/weight": None, "client/2/weight": 0.2},  # a dropped client
    {"round": 3},  # an evaluation-only row
]


def test_weights_are_summed_over_rounds_and_the_largest_sum_names_the_client():
    # client 0: 0.8, client 1: 0.8 - 0 for the unlogged round = 0.8, client 2: 0.8 -> a three-way tie
    assert summed_weights(ROWS) == pytest.approx({0: 0.8, 1: 0.8, 2: 0.8})
    assert most_weighted_client(ROWS) is None
    rows = [*ROWS, {"round": 4, "client/2/weight": 0.01}]
    assert most_weighted_client(rows) == 2
    assert worst_is_most_weighted(rows, 2.0) == (1.0, 3)
    assert worst_is_most_weighted(rows, 0.0) == (0.0, 3)


def test_equal_weights_or_no_worst_client_decide_nothing():
    equal = [{"round": r, "client/0/weight": 0.25, "client/1/weight": 0.25, "client/2/weight": 0.25,
              "client/3/weight": 0.25} for r in range(3)]
    hit, n = worst_is_most_weighted(equal, 1.0)
    assert math.isnan(hit) and n == 4
    hit, _ = worst_is_most_weighted([*ROWS, {"round": 4, "client/2/weight": 0.01}], math.nan)
    assert math.isnan(hit)
    assert math.isnan(worst_is_most_weighted([{"round": 0}], 1.0)[0])


def test_binomial_tail_by_hand():
    # P(X >= 6), X ~ Bin(10, 0.2), summed term by term
    expected = sum(math.comb(10, k) * 0.2 ** k * 0.8 ** (10 - k) for k in range(6, 11))
    assert hit_pvalue(6, 10, 0.2) == pytest.approx(expected, rel=1e-12)
    assert hit_pvalue(0, 3, 0.2) == pytest.approx(1.0)
    assert math.isnan(hit_pvalue(0, 0, 0.2))


def _write_run(path, weights: list[list[float]], summary: dict) -> None:
    path.mkdir(parents=True)
    rows = [{"round": r, **{f"client/{c}/weight": w for c, w in enumerate(ws)}} for r, ws in enumerate(weights)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "summary.json").write_text(json.dumps(summary))


def test_section_reads_the_audit_inside_the_privacy_run_or_the_separate_audit_run(tmp_path):
    def run_dir_for(method, seed, attack):
        return tmp_path / (f"{method}-s{seed}" if attack == "privacy" else f"{method}-s{seed}-{attack}")

    skewed = [[0.2, 0.5, 0.3], [0.2, 0.4, 0.4]]  # client 1 carries the most weight
    # method a: the audit inside the privacy run; seed 0 hits, seed 1 misses
    _write_run(run_dir_for("a", 0, "privacy"), skewed, {"attack/mia_audit_worst_client": 1,
                                                         "attack/mia_audit_worst_client_auc": 0.8,
                                                         "attack/mia_audit_worst_client_tpr_at_fpr_1": 0.2})
    _write_run(run_dir_for("a", 1, "privacy"), skewed, {"attack/mia_audit_worst_client": 2,
                                                         "attack/mia_audit_worst_client_auc": 0.6,
                                                         "attack/mia_audit_worst_client_tpr_at_fpr_1": 0.1})
    # method b: its privacy run has no audit; the separate audit run does (equal weights)
    _write_run(run_dir_for("b", 0, "privacy"), [[0.5, 0.5]], {"attack/mia_auc": 0.7})
    _write_run(run_dir_for("b", 0, "audit"), [[0.5, 0.5]], {"attack/mia_worst_client": 0,
                                                            "attack/mia_worst_client_auc": 0.9,
                                                            "attack/mia_worst_client_tpr_at_fpr_1": 0.3})
    # method c: no audit anywhere -> no row; a failed seed of a is skipped
    _write_run(run_dir_for("c", 0, "privacy"), [[0.5, 0.5]], {"attack/mia_auc": 0.7})
    lines = client_leakage_lines(run_dir_for, {"a": [0, 1, 2], "b": [0], "c": [0]},
                                 lambda m, s: not (m == "a" and s == 2))
    table = lines[lines.index("| --- | ---: | ---: | ---: | --- |") + 1:]
    p = 1 - (2 / 3) ** 2  # at least one hit in two seeds at chance 1/3
    assert table == [f"| a | 2 | 0.700 ± 0.141 | 0.150 ± 0.071 | 1 of 2 (chance 0.7); p {p:.3g} |",
                     "| b | 1 | 0.900 | 0.300 | n/a (no single most-weighted client) |"]
    assert client_leakage_lines(run_dir_for, {"c": [0]}, lambda m, s: True) == []
