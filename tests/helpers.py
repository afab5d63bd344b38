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


def write_loans(path: Path, n: int = 400, seed: int = 0) -> None:
    """A small loans table (the README's own-data example): age, income (numeric), race (three groups with different
    approval rates), region (four values, a natural client column) and the target `approved` (yes / no)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    race = rng.choice(["White", "Black", "Asian"], size=n, p=[0.6, 0.3, 0.1])
    income = rng.normal(50, 10, size=n).round(1)
    base = pd.Series(race).map({"White": 0.55, "Black": 0.35, "Asian": 0.45}).to_numpy()
    approved = np.where(rng.random(n) < base + (income - 50) / 100, "yes", "no")
    pd.DataFrame({"age": rng.integers(18, 80, size=n), "income": income, "race": race,
                  "region": rng.choice(["north", "south", "east", "west"], size=n),
                  "approved": approved}).to_csv(path, index=False)


def write_tiny_yolo(root: Path, n_train: int = 12, n_val: int = 6) -> tuple[Path, Path]:
    """An ultralytics folder of small generated images (64x48), two person boxes each (label rows 0 and 2; row 1 is
    another class), and a groups CSV by label row: row 0 'dark' on even images, 'light' on odd ones; row 2 'light'.
    Returns (data.yaml, groups.csv)."""
    from PIL import Image

    rows = ["image,box,group"]
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i in range(n):
            name = f"{split}_{i:03d}"
            Image.new("RGB", (64, 48), (20 * i % 255, 90, 160)).save(root / "images" / split / f"{name}.jpg")
            (root / "labels" / split / f"{name}.txt").write_text(
                "0 0.30 0.50 0.20 0.60\n2 0.50 0.50 0.10 0.10\n0 0.70 0.50 0.20 0.60\n")
            rows += [f"{name}.jpg,0,{'dark' if i % 2 == 0 else 'light'}", f"{name}.jpg,2,light"]
    (root / "data.yaml").write_text("path: .\ntrain: images/train\nval: images/val\nnames: {0: person}\n")
    (root / "groups.csv").write_text("\n".join(rows) + "\n")
    return root / "data.yaml", root / "groups.csv"
