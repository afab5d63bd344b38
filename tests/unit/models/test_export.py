"""The exported global model: ultralytics.YOLO loads it (without resfl_lightning importable) and finds the same boxes
and scores as the simulator; resfl_lightning.models.predict adds per-box alpha_0 / vacuity.

Tolerances: boxes 1e-3 px, scores 1e-5 (ultralytics fuses Conv+BatchNorm at load, which changes float rounding;
measured differences are ~4e-6 px and ~6e-8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from resfl_lightning.federation.checkpoint import ServerState
from resfl_lightning.federation.state import FlatLayout
from resfl_lightning.models.export import (
    EvidentialLogit,
    choose_weights,
    evidential_logit,
    export_checkpoint,
    export_global_model,
    load_evidential,
)
from resfl_lightning.models.predict import predict
from resfl_lightning.models.yolo import EvidentialYOLO, YoloSpec

SIZE = 64
BOX_ATOL, SCORE_ATOL = 1e-3, 1e-5

# Runs in a fresh interpreter where importing resfl_lightning fails: the export must need ultralytics + torch only.
ULTRALYTICS_SCRIPT = r"""
import json, sys
import numpy as np

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "resfl_lightning":
            raise ImportError("resfl_lightning is blocked in this test")
        return None

sys.meta_path.insert(0, Block())
from ultralytics import YOLO

jobs = json.loads(sys.argv[1])
out = []
for job in jobs:
    model = YOLO(job["model"])
    images = [np.load(p) for p in job["images"]]  # HWC uint8 BGR
    res = model.predict(images, conf=job["conf"], iou=job["iou"], verbose=False)
    out.append({"names": model.names, "dets": [{"xyxy": r.boxes.xyxy.tolist(), "conf": r.boxes.conf.tolist(),
                                                 "cls": r.boxes.cls.tolist()} for r in res]})
assert not [m for m in sys.modules if m.startswith("resfl_lightning")]
print(json.dumps(out))
"""


def evidential_model(num_classes: int, seed: int) -> EvidentialYOLO:
    """A random-init model whose class scores vary strongly between anchors (spread last-conv weights, BN stats)."""
    torch.manual_seed(seed)
    model = EvidentialYOLO(YoloSpec(num_classes=num_classes, scale="femto", image_size=SIZE))
    for seq in model.detector.model[-1].cv3:
        nn.init.normal_(seq[-1].weight, std=1.0)
        nn.init.normal_(seq[-1].bias, std=1.0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.2)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def scene(height: int, width: int, seed: int) -> np.ndarray:
    """HWC uint8 BGR: a noisy background with a few bright and dark rectangles."""
    rng = np.random.default_rng(seed)
    img = rng.integers(60, 120, (height, width, 3), dtype=np.uint8)
    for _ in range(4):
        h, w = int(rng.integers(8, height // 2)), int(rng.integers(6, width // 3))
        y, x = int(rng.integers(0, height - h)), int(rng.integers(0, width - w))
        img[y: y + h, x: x + w] = rng.integers(0, 256, 3, dtype=np.uint8)
    return img


def to_tensor(images: list[np.ndarray]) -> torch.Tensor:
    """What ultralytics feeds the network for an image already at the model size: BGR->RGB, /255."""
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).flip(1).float() / 255.0


def run_ultralytics(jobs: list[dict], tmp_path: Path) -> list[dict]:
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp_path / "yolo"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", ULTRALYTICS_SCRIPT, json.dumps(jobs)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_same_detections(ours: dict, theirs: dict) -> None:
    n = len(theirs["conf"])
    assert len(ours["scores"]) == n
    if n:
        np.testing.assert_allclose(np.asarray(ours["boxes"]), np.asarray(theirs["xyxy"]), atol=BOX_ATOL, rtol=0)
        np.testing.assert_allclose(np.asarray(ours["scores"]), np.asarray(theirs["conf"]), atol=SCORE_ATOL, rtol=0)
        np.testing.assert_array_equal(np.asarray(ours["labels"]), np.asarray(theirs["cls"]).astype(int))


@pytest.mark.parametrize("z_scale", [0.5, 5.0, 40.0])
def test_evidential_logit_sigmoid_is_the_dirichlet_mean(z_scale: float):
    """sigmoid(logit_c) == alpha_c / alpha_0 with alpha = 1 + softplus(z), against a float64 numpy reference."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(3, 4, 5, 6, generator=g) * z_scale  # C = 3 classes + background
    alpha = 1.0 + np.logaddexp(0.0, z.double().numpy())  # softplus in float64
    expected = alpha[:, :3] / alpha.sum(1, keepdims=True)
    for module in (EvidentialLogit(3), evidential_logit(3)):
        got = torch.sigmoid(module(z).double()).numpy()
        np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-9)
    assert isinstance(evidential_logit(3), torch.fx.GraphModule)


def test_ultralytics_loads_the_export_and_finds_the_simulators_boxes(tmp_path: Path):
    models = {1: evidential_model(1, seed=0), 2: evidential_model(2, seed=1)}
    square = [scene(SIZE, SIZE, s) for s in range(3)]
    wide = [scene(40, 96, 10), scene(40, 96, 11)]  # letterboxed by ultralytics; predict() must do the same
    jobs, expected = [], []
    for c, model in models.items():
        names = {i: f"kind{i}" for i in range(c)}
        path = export_checkpoint(model, tmp_path / f"global{c}.pt", names=names)
        files = []
        for k, img in enumerate(square + wide):
            files.append(str(tmp_path / f"img{c}_{k}.npy"))
            np.save(files[-1], img)
        conf, iou = 0.3, 0.5
        jobs += [{"model": str(path), "images": files[:3], "conf": conf, "iou": iou},
                 {"model": str(path), "images": files[3:], "conf": conf, "iou": iou}]
        # The simulator's own post-NMS predictions on the same pixels (square images: no letterbox).
        with torch.no_grad():
            sim = model.predict(model(to_tensor(square)), conf=conf, iou=iou)
        expected.append((names, [{k: v.tolist() for k, v in d.items()} for d in sim]))
        via_api = predict(path, wide, conf=conf, iou=iou)
        expected.append((names, [{"boxes": d.boxes.tolist(), "scores": d.scores.tolist(),
                                  "labels": d.labels.tolist()} for d in via_api]))
    results = run_ultralytics(jobs, tmp_path)
    n_boxes = 0
    for (names, ours), theirs in zip(expected, results):
        assert {int(k): v for k, v in theirs["names"].items()} == names
        for o, t in zip(ours, theirs["dets"], strict=True):
            assert_same_detections(o, t)
            n_boxes += len(t["conf"])
    assert n_boxes >= 20  # the comparison is not vacuous


def test_predict_reports_evidence_consistent_with_the_model(tmp_path: Path):
    model = evidential_model(1, seed=0)
    path = export_checkpoint(model, tmp_path / "global.pt", names={0: "person"}, metadata={"round": 7})
    images = [scene(SIZE, SIZE, s) for s in range(2)]
    dets = predict(path, images, conf=0.2, iou=0.5)
    with torch.no_grad():
        sim = model.predict(model(to_tensor(images)), conf=0.2, iou=0.5)
    assert sum(len(d) for d in dets) > 4
    for d, s in zip(dets, sim):
        torch.testing.assert_close(d.alpha0, s["alpha0"], rtol=1e-5, atol=0)
        torch.testing.assert_close(d.vacuity, 2.0 / s["alpha0"], rtol=1e-5, atol=0)  # K = C + 1 = 2 outcomes
        # alpha_person = score * alpha_0 and alpha_background = (1 - score) * alpha_0 are both >= 1 (alpha = 1 + e)
        assert bool((d.scores * d.alpha0 >= 1 - 1e-4).all() and ((1 - d.scores) * d.alpha0 >= 1 - 1e-4).all())
        assert bool(((d.vacuity > 0) & (d.vacuity <= 1)).all()) and d.names == {0: "person"}
    # The evidential model travels in the same file, weights identical.
    loaded, info = load_evidential(path)
    assert info["round"] == 7 and info["names"] == {0: "person"} and info["spec"]["image_size"] == SIZE
    for (k, v), (k2, v2) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)
    # A tensor batch is used as is, like ultralytics does with tensors.
    from_tensor = predict(loaded, to_tensor(images), conf=0.2, iou=0.5)
    torch.testing.assert_close(from_tensor[0].boxes, dets[0].boxes)


class _Holder(nn.Module):
    """The part of a detection client the export touches: `.model` (an EvidentialYOLO) plus other state."""

    def __init__(self):
        super().__init__()
        self.model = evidential_model(1, seed=3)
        self.other = nn.Linear(2, 2)


def test_export_uses_the_swa_average_when_there_is_one_and_restores_the_client(tmp_path: Path):
    holder = _Holder()
    layout = FlatLayout.of(holder)
    theta = layout.flatten(holder)
    swa = theta + 0.01 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(0))
    live = theta - 0.5  # what the client holds when the export runs
    layout.load(holder, live, layout.int_buffers(holder))
    state = ServerState(round_idx=4, theta=theta, int_buffers=layout.int_buffers(holder), swa=swa, swa_count=3)
    path = export_global_model(holder, layout, state, tmp_path / "export" / "global.pt", {0: "person"})
    torch.testing.assert_close(layout.flatten(holder), live, rtol=0, atol=0)  # restored
    loaded, info = load_evidential(path)
    assert info["weights"] == "swa (3 rounds averaged)" and info["round"] == 4
    reference = _Holder()
    layout.load(reference, swa, state.int_buffers)
    for k, v in reference.model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    # final: the last global model; swa without an average is an error naming the key
    assert choose_weights(state, "final")[1] == "final" and torch.equal(choose_weights(state, "final")[0], theta)
    no_swa = ServerState(round_idx=4, theta=theta, int_buffers={}, swa=None, swa_count=0)
    assert choose_weights(no_swa, "auto")[1] == "final"
    with pytest.raises(ValueError, match="export.weights=swa"):
        choose_weights(no_swa, "swa")
    with pytest.raises(ValueError, match="export.weights must be"):
        choose_weights(no_swa, "best")


def test_load_evidential_names_the_problem(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="export/global.pt"):
        load_evidential(tmp_path / "missing.pt")
    torch.save({"model": None}, tmp_path / "plain.pt")
    with pytest.raises(ValueError, match="not exported by resfl-lightning"):
        load_evidential(tmp_path / "plain.pt")


def test_predict_command_prints_the_boxes_and_evidence_of_each_image(tmp_path: Path, capsys):
    import cv2

    from resfl_lightning.cli.predict import main

    path = export_checkpoint(evidential_model(1, seed=0), tmp_path / "global.pt", names={0: "person"})
    files = []
    for s in range(2):
        files.append(tmp_path / f"scene{s}.png")
        cv2.imwrite(str(files[-1]), scene(SIZE, SIZE, s))
    assert main([str(path), *map(str, files), "--conf", "0.2", "--iou", "0.5", "--out", str(tmp_path / "d.json")]) == 0
    printed = json.loads((tmp_path / "d.json").read_text())
    dets = predict(path, [str(f) for f in files], conf=0.2, iou=0.5)
    assert [p["image"] for p in printed] == [str(f) for f in files] and sum(len(d) for d in dets) > 4
    for p, d in zip(printed, dets):
        assert len(p["detections"]) == len(d)
        for box, i in zip(p["detections"], range(len(d))):
            assert box["xyxy"] == pytest.approx(d.boxes[i].tolist()) and box["name"] == "person"
            assert (box["score"], box["alpha0"], box["vacuity"]) == pytest.approx(
                (float(d.scores[i]), float(d.alpha0[i]), float(d.vacuity[i])))
    assert main([str(tmp_path / "missing.pt"), str(files[0])]) == 2
    assert "no exported model" in capsys.readouterr().err


@pytest.mark.slow
def test_export_command_rebuilds_the_runs_own_export(tmp_path: Path):
    """`resfl export RUN` from checkpoints/last.pt and the run's config gives the model the run exported itself."""
    from resfl_lightning.cli.export import main

    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "resfl_lightning", "train", "logger=none", "progress=false", "model.scale=femto",
           "dataset.num_images=48", "dataset.image_size=64", "dataset.extra_reserve_images=0", "dataset.num_clients=2",
           "dataset.batch_size=8", "federation.rounds=1", f"run_dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert main([str(run_dir), "--out", str(tmp_path / "again.pt"), "--weights", "final"]) == 0
    ours, info = load_evidential(tmp_path / "again.pt")
    theirs, their_info = load_evidential(run_dir / "export" / "global.pt")
    assert info["names"] == their_info["names"] and info["round"] == their_info["round"] == 0
    for (k, v), (k2, v2) in zip(ours.state_dict().items(), theirs.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2), k
    assert main([str(run_dir), "--weights", "swa"]) == 2  # the run kept no SWA average: named, nothing written


def test_traced_logit_has_no_string_globals():
    """torch 2.11 cannot pickle a traced module whose code globals hold a string (a postponed annotation became one):
    the export failed on the GPU machine's torch 2.11; torch 2.14 pickles it, so this checks the cause itself."""
    from resfl_lightning.models.export import evidential_logit

    code = evidential_logit(2).graph.python_code("self")
    assert not [k for k, v in code.globals.items() if isinstance(v, str)]
