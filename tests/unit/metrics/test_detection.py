"""mAP wrapper: agrees with torchmetrics called directly, 1.0 for perfect predictions, a hand-computed AP."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.detection import MeanAveragePrecision

from resfl_lightning.metrics.detection import detection_map, to_torchmetrics


def random_case(seed: int, n_images: int = 8):
    gen = torch.Generator().manual_seed(seed)
    preds, gts = [], []
    for _ in range(n_images):
        m = int(torch.randint(1, 6, (1,), generator=gen))
        xy = torch.rand(m, 2, generator=gen) * 200
        gb = torch.cat([xy, xy + 20 + torch.rand(m, 2, generator=gen) * 60], 1)
        gl = torch.randint(0, 2, (m,), generator=gen)
        # Jittered copies of the GT plus random false positives, with extra keys our dicts carry.
        fp = torch.rand(3, 4, generator=gen) * 100
        pb = torch.cat([gb + torch.randn(m, 4, generator=gen) * 6, torch.cat([fp[:, :2], fp[:, :2] + 30], 1)])
        n = pb.shape[0]
        preds.append(
            {
                "boxes": pb.double(),
                "scores": torch.rand(n, generator=gen),
                "labels": torch.cat([gl, torch.randint(0, 2, (3,), generator=gen)]),
                "alpha0": torch.rand(n, generator=gen) * 10,
            }
        )
        gts.append({"boxes": gb, "labels": gl, "groups": torch.randint(-1, 3, (m,), generator=gen)})
    return preds, gts


@pytest.mark.parametrize("seed", [0, 1])
def test_wrapper_equals_torchmetrics_direct(seed):
    preds, gts = random_case(seed)
    ours = detection_map(preds, gts, class_metrics=True)
    direct = MeanAveragePrecision(iou_type="bbox", backend="faster_coco_eval", class_metrics=True)
    direct.update(
        [{"boxes": p["boxes"].float(), "scores": p["scores"], "labels": p["labels"]} for p in preds],
        [{"boxes": g["boxes"], "labels": g["labels"]} for g in gts],
    )
    ref = direct.compute()
    assert 0.0 < ours["map"] < 1.0
    for key in ("map", "map_50", "map_75"):
        assert ours[key] == pytest.approx(float(ref[key]))
    for c, v in zip(ref["classes"].tolist(), ref["map_per_class"].tolist(), strict=True):
        assert ours[f"map/{c}"] == pytest.approx(v)


def test_perfect_predictions_give_one():
    _, gts = random_case(3)
    preds = [{"boxes": g["boxes"], "scores": torch.ones(len(g["labels"])), "labels": g["labels"]} for g in gts]
    out = detection_map(preds, gts)
    assert out["map"] == pytest.approx(1.0) and out["map_50"] == pytest.approx(1.0)


def test_hand_computed_ap():
    # One image, two persons. Detections by score: TP (IoU 1), FP, TP (IoU 1).
    # Precision/recall: (1, .5), (.5, .5), (2/3, 1). COCO's 101-point interpolated precision is 1 for the 51 recall
    # points <= .5 and 2/3 for the 50 above, so AP = (51 + 50 * 2/3) / 101 at every IoU threshold.
    gt = {"boxes": torch.tensor([[0.0, 0, 50, 50], [100, 100, 150, 150]]), "labels": torch.tensor([0, 0])}
    pred = {
        "boxes": torch.tensor([[0.0, 0, 50, 50], [200, 200, 250, 250], [100, 100, 150, 150]]),
        "scores": torch.tensor([0.9, 0.8, 0.7]),
        "labels": torch.tensor([0, 0, 0]),
    }
    out = detection_map([pred], [gt])
    expected = (51 + 50 * 2 / 3) / 101
    assert out["map"] == pytest.approx(expected, abs=1e-6) and out["map_50"] == pytest.approx(expected, abs=1e-6)


def test_to_torchmetrics_format_and_errors():
    preds, gts = random_case(4, n_images=2)
    tp, tt = to_torchmetrics(preds, gts)
    assert set(tp[0]) == {"boxes", "scores", "labels"} and set(tt[0]) == {"boxes", "labels"}
    assert tp[0]["boxes"].dtype == torch.float32 and tt[0]["labels"].dtype == torch.long
    with pytest.raises(ValueError, match="2 images"):
        to_torchmetrics(preds, gts[:1])
    with pytest.raises(KeyError, match="image 1"):
        to_torchmetrics(preds, [gts[0], {"boxes": gts[1]["boxes"]}])
