"""Does the client whose data leaks most (the per-client membership audit) get the most aggregation weight?"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats

from resfl_lightning.metrics.mechanism import client_map

# Summed weights closer than this (relative to the largest) are a tie: no client is "the most weighted" (FedAvg's
# equal shards give every client 1/N a round).
TIE_TOLERANCE = 1e-9


def summed_weights(rows: Sequence[dict]) -> dict[int, float]:
    """client id -> its aggregation weight (client/<i>/weight) summed over the run's rounds."""
    total: dict[int, float] = {}
    for row in rows:
        for cid, w in client_map(row, "weight").items():
            total[cid] = total.get(cid, 0.0) + w
    return dict(sorted(total.items()))


def _leader(total: dict[int, float]) -> int | None:
    if not total:
        return None
    top = max(total.values())
    leaders = [c for c, w in total.items() if top - w <= TIE_TOLERANCE * max(abs(top), 1e-12)]
    return leaders[0] if len(leaders) == 1 else None


def most_weighted_client(rows: Sequence[dict]) -> int | None:
    """The client with the largest summed weight; None when no weight was logged or the largest is tied."""
    return _leader(summed_weights(rows))


def worst_is_most_weighted(rows: Sequence[dict], worst_client: float | None) -> tuple[float, int]:
    """(1.0 / 0.0 whether the audit's worst client is the most-weighted one, NaN when either is undefined; the number
    of clients that logged a weight, whose reciprocal is the chance of a hit if leakage ignored the weights)."""
    total = summed_weights(rows)
    top = _leader(total)
    if top is None or worst_client is None or not math.isfinite(float(worst_client)):
        return math.nan, len(total)
    return float(int(worst_client) == top), len(total)


def hit_pvalue(hits: int, trials: int, chance: float) -> float:
    """One-sided exact binomial p of at least `hits` in `trials` at probability `chance` (NaN with no trial)."""
    if trials == 0:
        return math.nan
    return float(stats.binomtest(hits, trials, chance, alternative="greater").pvalue)
