"""Fairness matching protocol: hand-computed cases, per-image (never pooled) IoU, greedy properties."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import box_iou

from resfl_lightning.metrics.fairness import group_counts
from resfl_lightning.metrics.matching import match_image, match_pred_gt


def boxes(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).reshape(-1, 4)


def match(pb, ps, pl, gb, gl, thr=0.5):
    p2g, gm = match_image(pb, torch.tensor(ps, dtype=torch.float32), torch.tensor(pl), gb, torch.tensor(gl), thr)
    return p2g.tolist(), gm.tolist()


def test_higher_score_wins_even_when_lower_score_has_better_iou():
    # GT [0,0,10,10]; P0 (score .9) IoU 0.6, P1 (score .5) IoU 0.95. Greedy by score: P0 takes it, P1 is unmatched.
    # An IoU-first matcher would give the GT to P1.
    gt = boxes([0, 0, 10, 10])
    assert match(boxes([0, 0, 10, 6], [0, 0, 10, 9.5]), [0.9, 0.5], [0, 0], gt, [0]) == ([0, -1], [True])


def test_prediction_takes_highest_iou_gt_not_the_first():
    # GT0 [2,0,12,10], GT1 [0,0,10,10].
    # P0 (.9) [0.5,0,10.5,10]: IoU(GT0) = 85/115 = .739, IoU(GT1) = 95/105 = .905 -> GT1.
    # P1 (.8) [0,0,10,10]:     IoU(GT0) = 80/120 = .667, IoU(GT1) = 1 but taken      -> GT0.
    gt = boxes([2, 0, 12, 10], [0, 0, 10, 10])
    assert match(boxes([0.5, 0, 10.5, 10], [0, 0, 10, 10]), [0.9, 0.8], [0, 0], gt, [0, 0]) == ([1, 0], [True, True])


def test_class_mismatch_never_matches():
    # P0 is a perfect box of the wrong class; P1 (lower score) of the right class matches.
    gt = boxes([0, 0, 10, 10])
    assert match(boxes([0, 0, 10, 10], [0, 0, 10, 10]), [0.9, 0.3], [1, 0], gt, [0]) == ([-1, 0], [True])


def test_iou_threshold_is_inclusive():
    gt = boxes([0, 0, 10, 10])
    # [0,0,10,5]: IoU = 50/100 = 0.5 exactly -> matches at 0.5, not at 0.6.
    assert match(boxes([0, 0, 10, 5]), [0.9], [0], gt, [0]) == ([0], [True])
    assert match(boxes([0, 0, 10, 5]), [0.9], [0], gt, [0], thr=0.6) == ([-1], [False])
    # [0,0,10,4.99]: IoU = 0.499 -> no match.
    assert match(boxes([0, 0, 10, 4.99]), [0.9], [0], gt, [0]) == ([-1], [False])


def test_two_predictions_on_one_gt_give_one_match():
    gt = boxes([0, 0, 10, 10])
    assert match(boxes([0, 0, 10, 10], [0, 0, 10, 9]), [0.9, 0.8], [0, 0], gt, [0]) == ([0, -1], [True])


def test_score_tie_broken_by_higher_iou():
    # Equal scores: P1 (IoU .9) beats P0 (IoU .6) although P0 comes first.
    gt = boxes([0, 0, 10, 10])
    assert match(boxes([0, 0, 10, 6], [0, 0, 10, 9]), [0.7, 0.7], [0, 0], gt, [0]) == ([-1, 0], [True])


def test_empty_predictions_and_empty_gts():
    empty = torch.zeros((0, 4))
    p2g, gm = match_image(
        empty, torch.zeros(0), torch.zeros(0, dtype=torch.long), boxes([0, 0, 1, 1]), torch.tensor([0])
    )
    assert p2g.tolist() == [] and gm.tolist() == [False]
    p2g, gm = match_image(boxes([0, 0, 1, 1]), torch.tensor([0.9]), torch.tensor([0]), empty, torch.zeros(0).long())
    assert p2g.tolist() == [-1] and gm.tolist() == [] and p2g.dtype == torch.long and gm.dtype == torch.bool


def test_match_pred_gt_score_threshold_keeps_original_indices():
    pred = {
        "boxes": boxes([0, 0, 10, 10], [20, 0, 30, 10], [0, 0, 10, 10]),
        "scores": torch.tensor([0.1, 0.9, 0.4]),
        "labels": torch.tensor([0, 0, 0]),
    }
    gt = {"boxes": boxes([20, 0, 30, 10], [0, 0, 10, 10]), "labels": torch.tensor([0, 0])}
    p2g, gm = match_pred_gt(pred, gt, score_threshold=0.25)
    # Pred 0 (score .1) is ignored even though it is a perfect box; pred 2 gets GT 1 instead.
    assert p2g.tolist() == [-1, 0, 1] and gm.tolist() == [True, True]
    p2g, _ = match_pred_gt(pred, gt, score_threshold=0.0)
    assert p2g.tolist() == [-1, 0, 1]  # without a threshold pred 2 (.4) still beats pred 0 (.1) to GT 1
    assert match_pred_gt(pred, gt, score_threshold=0.5)[0].tolist() == [-1, 0, -1]


def test_iou_is_never_pooled_across_images():
    # Image 0: a group-0 person, no predictions. Image 1: a group-1 person far away and a false positive sitting
    # exactly where image 0's person is. Per image: no TP at all. Pooling boxes across images would call it a TP.
    gt0 = {"boxes": boxes([0, 0, 10, 10]), "labels": torch.tensor([0]), "groups": torch.tensor([0])}
    gt1 = {"boxes": boxes([50, 50, 60, 60]), "labels": torch.tensor([0]), "groups": torch.tensor([1])}
    empty = {"boxes": torch.zeros((0, 4)), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.long)}
    fp = {"boxes": boxes([0, 0, 10, 10]), "scores": torch.tensor([0.9]), "labels": torch.tensor([0])}
    tp, fn = group_counts([(empty, gt0), (fp, gt1)], num_groups=2)
    assert tp.tolist() == [0, 0] and fn.tolist() == [1, 1]
    # The pooled (wrong) computation gives a different answer, so the test would catch pooling.
    _, pooled = match_image(
        fp["boxes"], fp["scores"], fp["labels"], torch.cat([gt0["boxes"], gt1["boxes"]]), torch.tensor([0, 0])
    )
    assert pooled.tolist() == [True, False]


def test_greedy_properties_on_random_images():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, m = int(torch.randint(0, 12, (1,), generator=gen)), int(torch.randint(0, 8, (1,), generator=gen))
        xy = torch.rand(n + m, 2, generator=gen) * 40
        wh = torch.rand(n + m, 2, generator=gen) * 20 + 5
        b = torch.cat([xy, xy + wh], 1)
        pb, gb = b[:n], b[n:]
        scores = torch.randint(0, 5, (n,), generator=gen).float() / 4  # many ties on purpose
        pl, gl = torch.randint(0, 2, (n,), generator=gen), torch.randint(0, 2, (m,), generator=gen)
        p2g, gm = match_image(pb, scores, pl, gb, gl, 0.3)
        matched = p2g[p2g >= 0]
        assert matched.unique().numel() == matched.numel(), "one-to-one"
        assert gm.sum() == matched.numel() and gm[matched].all()
        if n and m:
            iou = box_iou(pb, gb)
            eligible = (pl[:, None] == gl[None, :]) & (iou >= 0.3)
            for i, j in enumerate(p2g.tolist()):
                if j >= 0:
                    assert eligible[i, j]
            # Greedy is maximal: no unmatched prediction could still take an unmatched GT.
            assert not eligible[p2g < 0][:, ~gm].any()
            # The top-scoring prediction with any eligible GT gets its best-IoU GT when it is alone at its score.
            order = torch.argsort(-scores, stable=True)
            first = next((int(i) for i in order if eligible[i].any()), None)
            if first is not None and (scores == scores[first]).sum() == 1:
                best = torch.where(eligible[first], iou[first], torch.tensor(-1.0)).argmax()
                assert p2g[first] == best


def test_bad_shapes_name_the_argument():
    with pytest.raises(ValueError, match="pred_scores"):
        match_image(boxes([0, 0, 1, 1]), torch.tensor([0.1, 0.2]), torch.tensor([0]), boxes(), torch.zeros(0).long())
    with pytest.raises(ValueError, match="gt_boxes"):
        match_image(boxes(), torch.zeros(0), torch.zeros(0).long(), torch.zeros(3), torch.zeros(0).long())
    with pytest.raises(KeyError, match="scores"):
        match_pred_gt({"boxes": boxes(), "labels": torch.zeros(0)}, {"boxes": boxes(), "labels": torch.zeros(0)})
