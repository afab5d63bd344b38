"""Small builders shared by tests: a composed Hydra config and a tiny detection batch."""

from __future__ import annotations

from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

CONF = str(Path(__file__).resolve().parents[1] / "conf")


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def tiny_batch(size: int = 64) -> dict[str, torch.Tensor]:
    """Two images: image 0 holds one group-1 person, image 1 holds two group-2 persons."""
    g = torch.Generator().manual_seed(0)
    return {
        "img": torch.rand(2, 3, size, size, generator=g),
        "batch_idx": torch.tensor([0.0, 1.0, 1.0]),
        "cls": torch.zeros(3, 1),
        "bboxes": torch.tensor([[0.5, 0.5, 0.4, 0.6], [0.3, 0.4, 0.3, 0.5], [0.7, 0.6, 0.25, 0.5]]),
        "groups": torch.tensor([1, 2, 2]),
        "image_id": torch.tensor([0, 1]),
    }
