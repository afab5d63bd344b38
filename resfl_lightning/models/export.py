"""The trained global detector as an ultralytics checkpoint (`runs/<run>/export/global.pt`).

`ultralytics.YOLO(path)` loads the file and `predict`s with it. Ultralytics' Detect head scores a class as
sigmoid(logit); the evidential head scores it as E[p_c] = alpha_c / alpha_0 over C classes + background, with
alpha = 1 + softplus(z). The export keeps every weight and appends, after each level's class convolution (which still
outputs the C + 1 evidence logits z), a fixed map to

    logit_c = log alpha_c - log(alpha_0 - alpha_c),   so that   sigmoid(logit_c) = alpha_c / alpha_0   exactly.

No linear layer can do this (the score is not a sigmoid of a linear function of z), so the map is a torch.fx
GraphModule: it pickles as generated torch code and loads without this package installed (ultralytics' default,
non-`ULTRALYTICS_SAFE_LOAD` loading). Boxes, NMS and thresholds are then ultralytics' own, equal to the simulator's.

The same file carries the full evidential model (Dirichlet head over C + 1 outcomes and the NIG box branch) under
the key "resfl"; `resfl_lightning.models.predict` reads it for per-box alpha_0 / vacuity.
"""

from __future__ import annotations

import copy
import datetime
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from resfl_lightning.models.yolo import EvidentialYOLO, YoloSpec

EXPORT_FORMAT = 1  # version of the "resfl" payload


class EvidentialLogit(nn.Module):
    """(B, C + 1, H, W) Dirichlet evidence logits -> (B, C, H, W) logits whose sigmoid is alpha_c / alpha_0."""

    def __init__(self, num_classes: int):
        super().__init__()
        self.num_classes = num_classes

    # Unannotated: fx keeps a postponed (string) annotation as a global of the traced code, which torch 2.11 could
    # not pickle (seen exporting on a GPU machine's torch 2.11).
    def forward(self, z):
        alpha = 1.0 + F.softplus(z.float())
        alpha_c = alpha[:, : self.num_classes]
        rest = alpha.sum(1, keepdim=True) - alpha_c  # alpha_0 - alpha_c >= C: no cancellation
        return (torch.log(alpha_c) - torch.log(rest)).to(z.dtype)


def evidential_logit(num_classes: int) -> nn.Module:
    """EvidentialLogit as a GraphModule (pickled as code, so loading needs only torch)."""
    return torch.fx.symbolic_trace(EvidentialLogit(num_classes))


def to_ultralytics(model: EvidentialYOLO, names: dict[int, str] | None = None) -> nn.Module:
    """A copy of the model's ultralytics DetectionModel whose Detect head outputs C classes scored alpha_c / alpha_0."""
    c = model.num_classes
    det = copy.deepcopy(model.detector).float().eval()
    detect = det.model[-1]
    for i, seq in enumerate(detect.cv3):
        seq[-1] = nn.Sequential(seq[-1], evidential_logit(c))
        if len(seq) != 3:
            raise RuntimeError(f"unexpected Detect class branch {i}: {seq}")
    detect.nc, detect.no = c, c + detect.reg_max * 4
    det.yaml = {**det.yaml, "nc": c}
    det.names = dict(names) if names else {i: f"class{i}" for i in range(c)}
    if len(det.names) != c:
        raise ValueError(f"{len(det.names)} class names for a model with {c} classes")
    det.args = {"imgsz": model.spec.image_size, "task": "detect"}
    for p in det.parameters():
        p.requires_grad_(False)
    return det


def export_checkpoint(model: EvidentialYOLO, path: Path | str, names: dict[int, str] | None = None,
                      metadata: dict | None = None) -> Path:
    """Write an ultralytics checkpoint of `model` (plus the evidential model under "resfl") to `path`."""
    from ultralytics import __version__ as ultralytics_version

    from resfl_lightning import __version__

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    det = to_ultralytics(model, names)
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    payload = {
        "date": datetime.datetime.now().isoformat(),
        "version": ultralytics_version,
        "epoch": -1,
        "best_fitness": None,
        "model": det,
        "ema": None,
        "updates": None,
        "optimizer": None,
        "train_args": {"imgsz": model.spec.image_size, "task": "detect", "model": "resfl-lightning"},
        "resfl": {"format": EXPORT_FORMAT, "resfl_version": __version__, "spec": asdict(model.spec),
                  "names": det.names, "state_dict": state, **(metadata or {})},
    }
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load_evidential(path: Path | str) -> tuple[EvidentialYOLO, dict]:
    """The evidential model stored in an export (eval mode, CPU) and its metadata (names, round, source...)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no exported model at {path} (a run writes runs/<run>/export/global.pt)")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)  # the ultralytics part is a pickled module
    meta = ckpt.get("resfl") if isinstance(ckpt, dict) else None
    if meta is None:
        raise ValueError(f"{path} has no 'resfl' entry: not exported by resfl-lightning")
    if meta.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{path}: export format {meta.get('format')} is not {EXPORT_FORMAT}")
    model = EvidentialYOLO(YoloSpec(**meta["spec"]))
    model.load_state_dict(meta["state_dict"])
    info = {k: v for k, v in meta.items() if k != "state_dict"}
    return model.eval(), info


def class_names(data: Any) -> dict[int, str]:
    """Class names of a federated detection dataset: the records' names (FACET, CARLA), else person detection."""
    records = getattr(getattr(data, "source", None), "records", None)
    if records is not None:
        return dict(enumerate(records.class_names))
    if data.num_classes == 1:
        return {0: "person"}  # the built-in benchmark: person detection
    return {i: f"class{i}" for i in range(data.num_classes)}


def choose_weights(state: Any, weights: str) -> tuple[torch.Tensor, str]:
    """(flat theta, source): `final` global model, `swa` average, or `auto` (the SWA average once SWA has started,
    as the evaluation uses it; else the final global model)."""
    if weights not in ("auto", "final", "swa"):
        raise ValueError(f"export.weights must be auto, final or swa, got {weights!r}")
    has_swa = state.swa is not None and state.swa_count > 0
    if weights == "swa" and not has_swa:
        raise ValueError("export.weights=swa but the run kept no SWA average (set algorithm.swa_start)")
    if weights != "final" and has_swa:
        return state.swa, f"swa ({state.swa_count} rounds averaged)"
    return state.theta, "final"


def export_global_model(client: nn.Module, layout: Any, state: Any, path: Path | str, names: dict[int, str],
                        weights: str = "auto") -> Path:
    """Export the run's global detector (`choose_weights` loaded into `client`); the client's weights are restored."""
    theta, source = choose_weights(state, weights)
    before = layout.flatten(client)
    layout.load(client, theta.to(before.device), state.int_buffers)
    try:
        return export_checkpoint(client.model, path, names=names,
                                 metadata={"round": int(state.round_idx), "weights": source})
    finally:
        layout.load(client, before, state.int_buffers)
