"""Which client's data leaks most, below `resfl table`: the per-client membership audit's worst client (its own run
with `--audit`, the privacy run's `attack/mia_audit_*` with `--audit-in-run`) beside the client the server weighted
most (metrics/client_leakage.py). Exploratory: no correction across methods."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from resfl_lightning.analysis.report import load_rounds
from resfl_lightning.metrics.client_leakage import hit_pvalue, worst_is_most_weighted
from resfl_lightning.metrics.intervals import mean_sd_text

# (summary key prefix of the per-client audit, the table run that holds it): in the privacy run when the audit ran
# inside it, else in the separate audit run.
AUDIT_SOURCES = (("attack/mia_audit_worst_client", "privacy"), ("attack/mia_worst_client", "audit"))


def audited_run(run_dir_for, method: str, seed: int):
    """(the run's rows and summary, the worst-client key prefix) of the (method, seed) run that holds a per-client
    audit, or None."""
    for prefix, attack in AUDIT_SOURCES:
        path = Path(run_dir_for(method, seed, attack))
        if not (path / "metrics.jsonl").is_file():
            continue
        run = load_rounds(path)
        if prefix in run.summary:
            return run, prefix
    return None


def client_leakage_lines(run_dir_for, seed_sets: dict[str, list[int]], finished) -> list[str]:
    """The section's lines ([] when no run of the table has a per-client audit). `run_dir_for(method, seed,
    attack)` is the table's run directory, `finished(method, seed)` whether that seed's runs finished."""
    rows = []
    for method, seeds in seed_sets.items():
        found = [a for s in seeds if finished(method, s) and (a := audited_run(run_dir_for, method, s)) is not None]
        if not found:
            continue
        auc = [run.summary.get(prefix + "_auc") for run, prefix in found]
        tpr = [run.summary.get(prefix + "_tpr_at_fpr_1") for run, prefix in found]
        hits = [worst_is_most_weighted(run.rows, run.summary.get(prefix)) for run, prefix in found]
        decided = [(h, n) for h, n in hits if not math.isnan(h)]
        if decided:
            k, chance = int(sum(h for h, _ in decided)), float(np.mean([1.0 / n for _, n in decided]))
            share = (f"{k} of {len(decided)} (chance {chance * len(decided):.1f}); "
                     f"p {hit_pvalue(k, len(decided), chance):.3g}")
        else:
            share = "n/a (no single most-weighted client)"
        rows.append(f"| {method} | {len(found)} | {mean_sd_text(auc)} | {mean_sd_text(tpr)} | {share} |")
    if not rows:
        return []
    return ["", "Which client's data leaks most (the per-client membership audit; exploratory, no correction across "
            "methods): the audit's worst client (highest TPR at 1 % FPR, docs/method.md §7), its AUC and TPR@1 % "
            "(mean ± std over seeds), and the seeds on which it is the client with the largest aggregation weight "
            "summed over the rounds, against the count expected if leakage ignored the weights (1/N a seed) with the "
            "one-sided exact binomial p; equal weights (FedAvg's equal shards) name no such client.", "",
            "| method | seeds | worst client's AUC | worst client's TPR@1% | worst client = most-weighted client |",
            "| --- | ---: | ---: | ---: | --- |", *rows]
