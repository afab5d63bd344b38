"""Mechanism check for UFM weighting: does a client's UFM rank clients the way their validation ΔEOP does?"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats


def ufm_fairness_correlation(ufm: Sequence[float], delta_eop: Sequence[float]) -> float:
    """Spearman correlation between per-client UFM and per-client validation ΔEOP over clients where both are
    finite; NaN with fewer than 3 such clients or a constant column (the rank correlation is undefined)."""
    pairs = [(float(u), float(e)) for u, e in zip(ufm, delta_eop) if math.isfinite(u) and math.isfinite(e)]
    if len(pairs) < 3:
        return math.nan
    u, e = np.array(pairs).T
    if np.all(u == u[0]) or np.all(e == e[0]):
        return math.nan
    return float(stats.spearmanr(u, e).statistic)


def client_map(row: dict, suffix: str) -> dict[int, float]:
    """client id -> finite value of client/<i>/<suffix> in one round's metrics row, in client order."""
    found = {int(k.split("/")[1]): v for k, v in row.items() if k.startswith("client/") and k.endswith("/" + suffix)}
    return {c: float(v) for c, v in sorted(found.items())
            if isinstance(v, (int, float)) and math.isfinite(float(v))}


def _client_values(row: dict, suffix: str) -> list[float]:
    """Finite values of client/<i>/<suffix> in one round's metrics row, in client order."""
    return list(client_map(row, suffix).values())


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(float(v))]
    return float(np.mean(finite)) if finite else math.nan


def _logged(row: dict, key: str):
    """The round's value of `key`, NaN in a round that did not log it."""
    return row[key] if key in row else math.nan


def run_mechanism(rows: Sequence[dict], skewed: Sequence[int] | None = None) -> dict[str, float]:
    """What UFM weighting had to act on in one run, from its per-round metrics rows (metrics.jsonl).

    Over the informative rounds, those where raw UFM differs across clients (early on nothing is detected and every
    client's UFM is 0, which ranks nothing):
    - ufm_se: median over those rounds of the clients' median bootstrap SE of raw UFM;
    - ufm_spread: median over those rounds of the standard deviation of raw UFM across clients (ddof=0);
    - se_over_spread: their ratio (well below 1: UFM ranks clients by more than noise);
    - informative_rounds: how many rounds that was.
    Over every round: spearman, the mean Spearman correlation of client UFM vs client validation ΔEOP (undefined
    rounds skipped); max_weight, the mean largest client weight (1/N: uniform averaging); gated_uniform_rounds,
    rounds in which every client was gated (the weights fell back to uniform).
    With `skewed` (the quality_skew scenario's degraded clients): weight_skewed / weight_clean, the mean aggregation
    weight of a skewed / a clean client over the informative rounds (equal: the weighting did not single them out)."""
    se, spread, w_skewed, w_clean = [], [], [], []
    skewed_ids = set(skewed or ())
    for row in rows:
        u = _client_values(row, "ufm_raw")
        if len(u) >= 2 and float(np.std(u)) > 0:
            spread.append(float(np.std(u)))
            s = _client_values(row, "ufm_se")
            se.append(float(np.median(s)) if s else math.nan)
            for cid, w in client_map(row, "weight").items():
                (w_skewed if cid in skewed_ids else w_clean).append(w)
    med_se = float(np.nanmedian(se)) if se and not all(math.isnan(x) for x in se) else math.nan
    med_spread = float(np.median(spread)) if spread else math.nan
    ratio = med_se / med_spread if spread else math.nan
    return {"ufm_se": med_se, "ufm_spread": med_spread, "se_over_spread": ratio,
            "informative_rounds": float(len(spread)),
            "spearman": _nanmean([_logged(r, "mechanism/spearman_ufm_val_delta_eop") for r in rows]),
            "max_weight": _nanmean([_logged(r, "clients/max_weight") for r in rows]),
            "gated_uniform_rounds": float(sum(float(r.get("aggregation/gated_uniform") or 0.0) for r in rows)),
            "weight_skewed": _nanmean(w_skewed) if skewed_ids else math.nan,
            "weight_clean": _nanmean(w_clean) if skewed_ids else math.nan}
