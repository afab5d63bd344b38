"""CARLA protocol (docs/method.md): fine-tune the round-T global model on clear frames, then evaluate 13 weather
conditions (`resfl finetune --run-dir runs/RUN [--epochs 10] [--dataset carla] [--out DIR] [KEY=VALUE ...]`).

1. Config: RUN/config.yaml (the resolved config the run used, written by RunFiles), else RUN/.hydra/config.yaml;
   --dataset NAME swaps in conf/dataset/NAME.yaml (e.g. a FACET-trained model fine-tuned on CARLA); KEY=VALUE
   overrides are merged last and must name existing keys (e.g. dataset.root=/data/carla fabric.accelerator=gpu
   fabric.precision=16-mixed) (trained/load.py).
2. Model: a fresh client of that config holding RUN/checkpoints/last.pt (read with weights_only=True).
3. Fine-tune on the clear training frames: the clients' train splits, only frames recorded as clear when the data
   records weather (CARLA). All layers; SGD with the run's momentum / weight decay, the backbone at lr x0.1 through
   parameter groups; --epochs 10 with lr x0.1 after epochs 6 and 8 (epochs 7-8 at 0.1, 9-10 at 0.01); grad-norm clip
   5; no augmentation; the run's loss, so the GRL adversary is on when its lambda_priv > 0 (--lambda-priv to set
   it); AMP when fabric.precision is 16-mixed / bf16-mixed (the GPU config), with the loss scaler stepping the
   optimizer.
4. Evaluate the test split before fine-tuning (sanity: equals the run's last test/*), then the 13 weather conditions
   after it: CARLA's real frames grouped by recorded condition, otherwise apply_weather corruptions.
Writes into OUT (default RUN/finetune): metrics.jsonl (one line per epoch), summary.json (before/test/*, weather/*),
weather.json, weather.png and finetuned.pt (readable with federation.checkpoint.load_checkpoint).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader

import resfl_lightning.env  # noqa: F401  (must precede ultralytics / wandb imports)
from resfl_lightning.clients.base import FederatedClient
from resfl_lightning.data.detection import DetectionDataset, detection_collate
from resfl_lightning.data.weather import condition_index
from resfl_lightning.evaluation.evaluation_pass import kept_test_metrics
from resfl_lightning.evaluation.weather import (
    MODES,
    evaluate_weather,
    image_conditions,
    plot_weather,
    resolve_mode,
    weather_metrics,
    write_weather_json,
)
from resfl_lightning.federation.local import train_epoch
from resfl_lightning.trained.load import build_trained_model, load_detection_run

CLEAR = condition_index("clear", 0)


@dataclass
class FinetuneSettings:
    """The fine-tuning recipe; defaults are the paper's CARLA protocol."""

    epochs: int = 10
    milestones: tuple[int, ...] = (6, 8)  # lr x gamma once this many epochs are done
    gamma: float = 0.1
    backbone_lr_scale: float = 0.1
    grad_clip: float = 5.0
    lr: float | None = None  # None: the run's optim.lr
    lambda_priv: float | None = None  # None: the run's algorithm.lambda_priv
    weather_seed: int = 0
    weather_mode: str = "auto"

    def __post_init__(self) -> None:
        self.milestones = tuple(int(m) for m in self.milestones)
        checks = [(self.epochs >= 1, "--epochs", "must be >= 1"), (0 < self.gamma <= 1, "--gamma", "must be in (0, 1]"),
                  (self.backbone_lr_scale >= 0, "--backbone-lr-scale", "must be >= 0"),
                  (self.grad_clip > 0, "--grad-clip", "must be > 0"),
                  (self.lr is None or self.lr > 0, "--lr", "must be > 0"),
                  (self.lambda_priv is None or self.lambda_priv >= 0, "--lambda-priv", "must be >= 0"),
                  (self.weather_mode in MODES, "--weather-mode", f"must be one of {MODES}"),
                  (all(m >= 1 for m in self.milestones), "--milestones", "must be epochs >= 1")]
        for ok, key, message in checks:
            if not ok:
                raise ValueError(f"{key} {message}; got {getattr(self, key[2:].replace('-', '_'))}")

    def lr_factor(self, epoch: int) -> float:
        """gamma ** (number of milestones already passed) for 0-based `epoch`."""
        return self.gamma ** sum(epoch >= m for m in self.milestones)


def backbone_parameters(client: FederatedClient) -> list[torch.nn.Parameter]:
    """Parameters of the YOLO backbone (the yaml's `backbone` layers, before neck and head)."""
    detector = client.model.detector
    n = len(detector.yaml["backbone"])
    return [p for layer in detector.model[:n] for p in layer.parameters()]


def parameter_groups(client: FederatedClient, lr: float, backbone_lr_scale: float) -> list[dict]:
    """[backbone at lr * backbone_lr_scale, everything else (neck, head, NIG branch, adversary) at lr]."""
    backbone = backbone_parameters(client)
    ids = {id(p) for p in backbone}
    rest = [p for p in client.parameters() if id(p) not in ids]
    return [{"params": backbone, "lr": lr * backbone_lr_scale, "name": "backbone"},
            {"params": rest, "lr": lr, "name": "head"}]


def finetune_indices(data) -> np.ndarray:
    """The clients' train images, restricted to clear frames when the data records weather (CARLA)."""
    idx = np.sort(np.concatenate([c.train for c in data.splits.clients]).astype(np.int64))
    conditions = image_conditions(data)
    if conditions is not None:
        idx = idx[conditions[idx] == CLEAR]
    if len(idx) == 0:
        raise ValueError("no clear training frame to fine-tune on (the clients' train splits hold none)")
    return idx


def finetune_loader(data, indices: np.ndarray, seed: int, epoch: int) -> DataLoader:
    """Shuffled, un-augmented loader over `indices` with the data's batch and image size."""
    ds = DetectionDataset(data.source, indices, augment=None, image_size=data.image_size, seed=seed)
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0]))
    return DataLoader(ds, batch_size=data.batch_size, shuffle=True, generator=gen, collate_fn=detection_collate,
                      num_workers=0)


def finetune(fabric: L.Fabric, client: FederatedClient, loader_for_epoch: Callable[[int], Iterable],
             settings: FinetuneSettings, lr: float, round_idx: int = 0) -> list[dict[str, float]]:
    """Train every layer with the recipe of `settings`; returns one log row per epoch."""
    client.train()
    groups = parameter_groups(client, lr, settings.backbone_lr_scale)
    base = [g["lr"] for g in groups]
    optimizer = fabric.setup_optimizers(torch.optim.SGD(groups, lr=lr, momentum=client.optim.momentum,
                                                        weight_decay=client.optim.weight_decay))
    log = []
    for epoch in range(settings.epochs):
        factor = settings.lr_factor(epoch)
        for group, b in zip(optimizer.param_groups, base):
            group["lr"] = b * factor
        client.begin_client(-1, round_idx)  # resets the running loss means; keeps the run's KL annealing point
        t0 = time.perf_counter()
        norms = train_epoch(fabric, client, optimizer, loader_for_epoch(epoch), settings.grad_clip,
                            f"fine-tuning epoch {epoch}")
        finite = [n for n in norms if math.isfinite(n)]
        row = {"epoch": epoch, "steps": len(norms), "skipped_steps": len(norms) - len(finite),  # AMP overflow
               "lr/backbone": optimizer.param_groups[0]["lr"], "lr/head": optimizer.param_groups[1]["lr"],
               "grad_norm/mean": float(np.mean(finite)) if finite else math.nan, "time/epoch": time.perf_counter() - t0}
        row.update({f"train/{k}": v for k, v in client.mean_losses().items()})
        log.append(row)
        loss = row["train/total"] if "train/total" in row else math.nan  # no step taken: no mean loss
        fabric.print(f"fine-tune epoch {epoch + 1}/{settings.epochs}: loss {loss:.4f}, lr {row['lr/head']:.2e}")
    return log


def _jsonable(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def run_finetune(run_dir: Path, settings: FinetuneSettings, out_dir: Path | None = None, dataset: str | None = None,
                 overrides: Sequence[str] = ()) -> dict:
    """The whole protocol (module docstring); returns the summary written to OUT/summary.json."""
    from resfl_lightning.federation.checkpoint import ServerState, save_checkpoint

    run_dir = Path(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "finetune"
    ckpt, cfg = load_detection_run(run_dir, dataset, overrides, "the weather protocol needs image detection")
    fabric = L.Fabric(accelerator=cfg.fabric.accelerator, devices=1, num_nodes=1, strategy="auto",
                      precision=cfg.fabric.precision)
    fabric.launch()
    if cfg.fabric.accelerator == "cpu":
        torch.set_num_threads(int(cfg.fabric.threads_per_process))
    data, client, layout, state = build_trained_model(cfg, ckpt, fabric)
    if settings.lambda_priv is not None:
        client.weights.lambda_priv = float(settings.lambda_priv)

    summary: dict = {"checkpoint": str(ckpt), "round": state.round_idx, "settings": asdict(settings),
                     "lambda_priv": client.weights.lambda_priv}
    kept = int(cfg.metrics.min_group_size)  # the run's minimum group size, as its own evaluation applied it
    summary.update({f"before/test/{k}": float(v)
                    for k, v in kept_test_metrics(client, data.test_loader(), kept).items()})
    indices = finetune_indices(data)
    summary["finetune_images"] = len(indices)
    lr = settings.lr if settings.lr is not None else float(cfg.optim.lr)
    t0 = time.perf_counter()
    log = finetune(fabric, client, lambda e: finetune_loader(data, indices, cfg.seed, e), settings, lr,
                   round_idx=max(state.round_idx, 0))
    summary["time/finetune"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    mode = resolve_mode(data, settings.weather_mode)
    rows = evaluate_weather(client, data, seed=settings.weather_seed, mode=mode, min_group_size=kept)
    summary["time/weather"] = time.perf_counter() - t0
    summary.update(weather_metrics(rows))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_weather_json(out_dir / "weather.json", rows, round=state.round_idx, seed=settings.weather_seed,
                       split="test", mode=mode, finetuned_epochs=settings.epochs)
    plot_weather(rows, out_dir / "weather.png", title=f"{run_dir.name}: fine-tuned {settings.epochs} epochs")
    (out_dir / "metrics.jsonl").write_text("".join(json.dumps({k: _jsonable(v) for k, v in r.items()}) + "\n"
                                                   for r in log))
    (out_dir / "summary.json").write_text(json.dumps({k: _jsonable(v) for k, v in summary.items()}, indent=2,
                                                     sort_keys=True))
    int_buffers = {k: v.cpu() for k, v in layout.int_buffers(client).items()}
    save_checkpoint(out_dir / "finetuned.pt", ServerState(round_idx=state.round_idx, theta=layout.flatten(client).cpu(),
                                                          int_buffers=int_buffers))
    fabric.print(f"fine-tuned model and weather evaluation ({mode}) written to {out_dir}")
    return summary
