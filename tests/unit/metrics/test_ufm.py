"""UFM on hand-computed cases, the reported value (clip, gate, EMA), and the label-free / partial-label cohorts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from resfl_lightning.metrics import ufm as U

EPS = 1e-6


def boxes(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).reshape(-1, 4)


def pred(rows, scores, alpha0):
    n = len(scores)
    return {
        "boxes": boxes(*rows),
        "scores": torch.tensor(scores, dtype=torch.float32).reshape(-1),
        "labels": torch.zeros(n, dtype=torch.long),
        "alpha0": torch.tensor(alpha0, dtype=torch.float32).reshape(-1),
    }


def gt(rows, groups):
    return {"boxes": boxes(*rows), "labels": torch.zeros(len(groups), dtype=torch.long), "groups": torch.tensor(groups)}


A, B, C = [0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]


def two_group_case():
    return [
        # g0 person matched with alpha0 10, g1 person matched with alpha0 4.
        (pred([A, B], [0.9, 0.8], [10, 4]), gt([A, B], [0, 1])),
        # Two g0 persons matched with alpha0 6 and 2 -> image mean 4; a false positive (alpha0 50) is ignored.
        (pred([A, B, [60, 60, 70, 70]], [0.9, 0.8, 0.9], [6, 2, 50]), gt([A, B], [0, 0])),
        # A g1 person never detected -> contributes 0 for g1.
        (pred([], [], []), gt([A], [1])),
        # g0 matched with alpha0 8; a score-.1 detection (below tau) with alpha0 1000 on the same person is ignored,
        # and an unknown-group (-1) person's detection (alpha0 77) is ignored.
        (pred([A, A, C], [0.1, 0.7, 0.9], [1000, 8, 77]), gt([A, C], [0, -1])),
    ]


def test_ufm_two_groups_hand_computed():
    # abar_0 = mean(10, 4, 8) = 22/3; abar_1 = mean(4, 0) = 2.
    # 1/abar = 3/22 and 1/2; Delta_u = 1/2 - 3/22 = 8/22; mean(1/abar) = (3/22 + 11/22)/2 = 7/22.
    # UFM = (8/22) / (7/22 + 1e-6) ~= 8/7.
    res = U.ufm_from_detections(two_group_case())
    assert res.mean_evidence == pytest.approx({0: 22 / 3, 1: 2.0})
    assert res.delta_u == pytest.approx(8 / 22)
    assert res.ufm == pytest.approx((8 / 22) / (7 / 22 + EPS), rel=1e-12)
    assert res.floored == ()
    assert res.as_dict("val/") == pytest.approx(
        {"val/ufm": res.ufm, "val/delta_u": 8 / 22, "val/mean_evidence/0": 22 / 3, "val/mean_evidence/1": 2.0}
    )


def test_group_without_detections_is_floored_and_absent_group_skipped():
    # g2 appears once and is never detected: abar_2 = 0 -> floored at 1e-3 -> 1/abar = 1000. g0: abar 2 (1/abar .5).
    # Groups 1 and 3..9 never appear in the split and are skipped (not treated as zero evidence).
    pairs = [(pred([A], [0.9], [2.0]), gt([A, B], [0, 2]))]
    res = U.ufm_from_detections(pairs, evidence_floor=1e-3)
    assert res.mean_evidence == pytest.approx({0: 2.0, 2: 1e-3}) and res.floored == (2,)
    # Delta_u = 1000 - 0.5 = 999.5; mean = 500.25; UFM = 999.5 / (500.25 + 1e-6).
    assert res.delta_u == pytest.approx(999.5)
    assert res.ufm == pytest.approx(999.5 / (500.25 + EPS), rel=1e-12)
    assert math.isfinite(res.ufm)


def test_single_group_gives_zero_and_no_group_raises():
    res = U.ufm_from_detections([(pred([A], [0.9], [5.0]), gt([A], [3]))])
    assert res.ufm == 0.0 and res.mean_evidence == {3: 5.0}
    with pytest.raises(ValueError, match="no ground-truth person"):
        U.ufm_from_detections([(pred([A], [0.9], [5.0]), gt([A], [-1]))])
    with pytest.raises(KeyError, match="alpha0"):
        U.ufm_from_detections([({k: v for k, v in pred([A], [0.9], [1]).items() if k != "alpha0"}, gt([A], [0]))])


def test_cohorts_override_groups():
    # Same images, cohorts swap the two persons of image 0: cohort 0 now sees alpha0 4 there.
    pairs = two_group_case()
    cohorts = [torch.tensor([1, 0]), torch.tensor([0, 0]), torch.tensor([1]), torch.tensor([0, -1])]
    res = U.ufm_from_detections(pairs, cohorts=cohorts)
    # abar_0 = mean(4, 4, 8) = 16/3, abar_1 = mean(10, 0) = 5.
    assert res.mean_evidence == pytest.approx({0: 16 / 3, 1: 5.0})


def test_ufm_from_samples_hand_computed():
    # g0: alpha0 2, 4, 6 -> 4; g1: 1, 3 -> 2; the unknown sample (alpha0 100) is ignored.
    # 1/abar = .25, .5 -> Delta_u = .25, mean = .375, UFM = .25 / (.375 + 1e-6) ~= 2/3.
    res = U.ufm_from_samples(torch.tensor([2.0, 4, 6, 1, 3, 100]), torch.tensor([0, 0, 0, 1, 1, -1]))
    assert res.mean_evidence == pytest.approx({0: 4.0, 1: 2.0})
    assert res.ufm == pytest.approx(0.25 / (0.375 + EPS), rel=1e-12)
    with pytest.raises(ValueError, match="lengths differ"):
        U.ufm_from_samples(torch.ones(3), torch.zeros(2, dtype=torch.long))


def test_reported_ufm_clip_and_gate():
    assert U.reported_ufm(1.2, map5095=0.5) == (1.2, None)
    assert U.reported_ufm(7.0, map5095=0.5).u == 5.0  # clipped to b
    assert U.reported_ufm(0.5, map5095=0.5, clip=(1.0, 3.0)).u == 1.0  # clipped to a
    assert U.reported_ufm(0.1, map5095=0.29).u == 5.0  # gated: mAP below 0.30 -> b
    assert U.reported_ufm(0.1, map5095=0.30).u == 0.1  # the gate is strict
    assert U.reported_ufm(0.1, map5095=0.1, gate_map=None).u == 0.1
    assert U.reported_ufm(0.1, map5095=-1.0, clip=(0.0, 2.0)).u == 2.0  # torchmetrics' -1 (no GT) is gated


def test_reported_ufm_ema():
    first = U.reported_ufm(2.0, 0.5, ema_prev=None, ema_decay=0.9)
    assert first == (2.0, 2.0)  # EMA starts at the first raw value
    nxt = U.reported_ufm(1.0, 0.5, ema_prev=first.ema, ema_decay=0.9)
    assert nxt.ema == pytest.approx(0.9 * 2.0 + 0.1 * 1.0) and nxt.u == pytest.approx(1.9)
    # The EMA runs on the raw value: its state stays unclipped even when u is clipped or gated.
    clipped = U.reported_ufm(10.0, 0.5, ema_prev=4.8, ema_decay=0.5)
    assert clipped.ema == pytest.approx(7.4) and clipped.u == 5.0
    gated = U.reported_ufm(1.0, 0.1, ema_prev=3.0, ema_decay=0.5)
    assert gated.ema == pytest.approx(2.0) and gated.u == 5.0


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"clip": (3.0, 1.0)}, "clip"),
        ({"ema_decay": 1.0}, "ema_decay"),
        ({"ema_decay": -0.1}, "ema_decay"),
        ({"ema_prev": 1.0}, "ema_decay"),
        ({"map5095": math.nan}, "map5095"),
    ],
)
def test_reported_ufm_validates_arguments(kwargs, msg):
    args = {"raw": 1.0, "map5095": 0.5} | kwargs
    with pytest.raises(ValueError, match=msg):
        U.reported_ufm(**args)


def test_ufm_formula_validates():
    with pytest.raises(ValueError, match="evidence_floor"):
        U.ufm_from_group_evidence({0: 1.0}, evidence_floor=0.0)
    with pytest.raises(ValueError, match="group 1"):
        U.ufm_from_group_evidence({0: 1.0, 1: math.inf})


# ---- cohorts ----


def test_kmeans_recovers_direction_clusters_regardless_of_norm():
    rng = np.random.default_rng(0)
    n = 200
    truth = rng.integers(0, 2, n)
    directions = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])[truth]
    # Norms 1 or 100, independent of the cluster: raw k-means splits by norm, normalised k-means by direction.
    scale = rng.choice([1.0, 100.0], n)[:, None]
    x = (directions + 0.05 * rng.standard_normal((n, 3))) * scale
    ids = U.cohorts_kmeans(torch.tensor(x), k=2, seed=0)
    assert ids.dtype == torch.long and adjusted_rand_score(truth, ids.numpy()) == 1.0
    raw = KMeans(n_clusters=2, random_state=0, n_init=10).fit_predict(x)
    assert adjusted_rand_score(truth, raw) < 0.5  # the normalisation is what makes the test pass
    with pytest.raises(ValueError, match="k must"):
        U.cohorts_kmeans(torch.tensor(x[:3]), k=4)


def test_vacuity_slices_are_quantile_balanced():
    rng = np.random.default_rng(0)
    alpha0 = rng.gamma(2.0, 3.0, 1003)
    vac = 1.0 / alpha0
    ids = U.cohorts_vacuity_slices(torch.tensor(vac), k=4).numpy()
    counts = np.bincount(ids, minlength=4)
    assert counts.max() - counts.min() <= 1 and counts.sum() == 1003
    for i in range(3):  # strata are ordered intervals of vacuity
        assert vac[ids == i].max() <= vac[ids == i + 1].min()
    # Matches the empirical quantile boundaries (continuous data, no ties).
    edges = np.quantile(vac, [0.25, 0.5, 0.75])
    agree = (np.searchsorted(edges, vac, side="right") == ids).mean()
    assert agree > 0.99
    # An undetected person (infinite vacuity) lands in the top stratum.
    with_inf = U.cohorts_vacuity_slices(torch.tensor([0.1, math.inf, 0.3, 0.2]), k=2)
    assert with_inf.tolist() == [0, 1, 1, 0]


def test_proxy_column_maps_to_ids():
    ids = U.cohorts_proxy(["dark", "bright", None, "dim", "bright", float("nan")])
    assert ids.tolist() == [1, 0, -1, 2, 0, -1]
    assert U.cohorts_proxy(np.array([3.0, 1.0, 3.0])).tolist() == [1, 0, 1]


def test_drop_group_labels_rate():
    gen = torch.Generator().manual_seed(0)
    groups = torch.randint(-1, 10, (20000,), generator=gen)
    known = groups >= 0
    out = U.drop_group_labels(groups, p=0.3, seed=1)
    dropped = known & (out == -1)
    assert int(dropped.sum()) == round(0.3 * int(known.sum()))
    assert (out[groups == -1] == -1).all() and (out[~dropped] == groups[~dropped]).all()
    for g in range(10):  # dropping is uniform across groups
        assert abs(float(dropped[groups == g].float().mean()) - 0.3) < 0.04
    assert torch.equal(out, U.drop_group_labels(groups, p=0.3, seed=1))
    assert not torch.equal(out, U.drop_group_labels(groups, p=0.3, seed=2))
    assert (U.drop_group_labels(groups, p=1.0) == -1).all()
    assert torch.equal(U.drop_group_labels(groups, p=0.0), groups)
    with pytest.raises(ValueError, match="p must"):
        U.drop_group_labels(groups, p=1.5)


def test_flip_group_labels_rate_and_never_same():
    gen = torch.Generator().manual_seed(0)
    groups = torch.randint(-1, 3, (60000,), generator=gen)
    known = groups >= 0
    out = U.flip_group_labels(groups, eta=0.2, num_groups=3, seed=3)
    changed = out != groups
    # With 3 groups, "flip to any random group" would change only 0.2 * 2/3 = 0.133 of the labels.
    assert abs(float(changed[known].float().mean()) - 0.2) < 0.01
    assert (out[~known] == -1).all() and out.min() >= -1 and out.max() <= 2
    # Flipped labels spread evenly over the other groups.
    from_zero = out[(groups == 0) & changed]
    assert abs(float((from_zero == 1).float().mean()) - 0.5) < 0.05 and not (from_zero == 0).any()
    assert (U.flip_group_labels(groups, eta=1.0, num_groups=3, seed=0)[known] != groups[known]).all()
    with pytest.raises(ValueError, match="num_groups"):
        U.flip_group_labels(groups, eta=0.1, num_groups=1)
    with pytest.raises(ValueError, match="groups must lie"):
        U.flip_group_labels(groups, eta=0.1, num_groups=2)


def _bootstrap_se_by_loop(units, resamples, seed, evidence_floor=1e-3, eps=1e-6):
    """The definition, one resample at a time: the reference for the vectorised ufm_bootstrap_se."""
    from resfl_lightning.metrics.ufm import ufm_from_units

    units = [u for u in units if u]
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(resamples):
        pick = [units[i] for i in rng.integers(0, len(units), len(units))]
        if len({g for u in pick for g in u}) >= 2:
            values.append(ufm_from_units(pick, evidence_floor, eps).ufm)
    return float(np.std(values, ddof=1)) if len(values) >= 2 else float("nan")


@pytest.mark.parametrize("seed", [0, 3, 17])
def test_ufm_bootstrap_se_equals_the_resample_loop(seed):
    from resfl_lightning.metrics.ufm import ufm_bootstrap_se

    rng = np.random.default_rng(100 + seed)
    # images hold one to three of four groups; some evidence below the floor, some groups rare
    units = []
    for _ in range(40):
        groups = rng.choice(4, size=rng.integers(1, 4), replace=False, p=[0.5, 0.3, 0.15, 0.05])
        units.append({int(g): float(rng.choice([0.0, 1e-4, rng.gamma(2.0, 3.0)])) for g in groups})
    units.append({})  # a unit without a known group is dropped, as in the loop
    got = ufm_bootstrap_se(units, resamples=150, seed=seed)
    assert got == pytest.approx(_bootstrap_se_by_loop(units, 150, seed), rel=1e-12, abs=1e-15)


def test_ufm_bootstrap_se_skips_single_group_resamples_like_the_loop():
    from resfl_lightning.metrics.ufm import ufm_bootstrap_se

    # group 1 appears in one unit of 12: many resamples miss it and must be skipped, not scored 0
    units = [{0: float(v)} for v in range(1, 12)] + [{1: 0.5}]
    got = ufm_bootstrap_se(units, resamples=300, seed=5)
    assert got == pytest.approx(_bootstrap_se_by_loop(units, 300, 5), rel=1e-12)
    assert math.isnan(ufm_bootstrap_se([{0: 1.0}, {0: 2.0}], resamples=50, seed=0))  # one group only: undefined


def test_ufm_bootstrap_se_names_the_bad_unit():
    from resfl_lightning.metrics.ufm import ufm_bootstrap_se

    with pytest.raises(ValueError, match="unit 1: evidence of group 2"):
        ufm_bootstrap_se([{0: 1.0}, {2: float("nan")}], resamples=10)
    with pytest.raises(ValueError, match="negative"):  # the loop's ufm_from_group_evidence refuses it too
        ufm_bootstrap_se([{0: 1.0}, {1: -2.0}, {0: 2.0}], resamples=10)
