"""`resfl finetune --run-dir runs/RUN`: the CARLA protocol on a finished run: fine-tune its global model on clear
frames, then evaluate 13 weather conditions (resfl_lightning/trained/finetune.py describes every step).

Writes into OUT (default RUN/finetune): metrics.jsonl, summary.json, weather.json, weather.png and finetuned.pt."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from resfl_lightning.evaluation.weather import MODES
from resfl_lightning.trained.finetune import FinetuneSettings, run_finetune


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="resfl finetune", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True, type=Path, help="training run directory (holds checkpoints/last.pt)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default RUN/finetune)")
    p.add_argument("--dataset", default=None, help="fine-tune / evaluate on conf/dataset/NAME.yaml instead")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--milestones", type=int, nargs="*", default=[6, 8], help="epochs after which lr x gamma")
    p.add_argument("--gamma", type=float, default=0.1)
    p.add_argument("--backbone-lr-scale", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=5.0, help="max gradient l2 norm")
    p.add_argument("--lr", type=float, default=None, help="head lr (default: the run's optim.lr)")
    p.add_argument("--lambda-priv", type=float, default=None, help="adversary weight (default: the run's)")
    p.add_argument("--weather-seed", type=int, default=0)
    p.add_argument("--weather-mode", default="auto", choices=MODES)
    p.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides, e.g. fabric.accelerator=gpu")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = FinetuneSettings(epochs=args.epochs, milestones=tuple(args.milestones), gamma=args.gamma,
                                    backbone_lr_scale=args.backbone_lr_scale, grad_clip=args.grad_clip, lr=args.lr,
                                    lambda_priv=args.lambda_priv, weather_seed=args.weather_seed,
                                    weather_mode=args.weather_mode)
        run_finetune(args.run_dir, settings, args.out, args.dataset, args.overrides)
    except (ValueError, FileNotFoundError) as err:
        print(f"finetune error: {err}", file=sys.stderr)
        return 2
    return 0
