"""Builders of small FACET- and CARLA-format folders (synthetic pixels and rows; no real data) for tests.

Every person is a solid rectangle in its Monk Skin Tone swatch colour on a green background, with a gap around it,
so a test can find a box back in the pixels after letterboxing. The returned descriptions hold what was written
(image sizes, pixel boxes, MST, lighting / weather), the expected values of the readers and loaders.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from resfl_lightning.data.facet import FACET_CSV_COLUMNS, LIGHTING_COLUMNS
from resfl_lightning.data.mst import MST_RGB
from resfl_lightning.data.weather import WEATHER_CONDITIONS

BACKGROUND_RGB = (40, 150, 70)  # far from every MST swatch
UNKNOWN_RGB = (200, 60, 200)  # persons of unknown MST
FACET_SIZES = ((96, 64), (64, 96), (80, 80), (120, 72))  # (width, height), cycled over the images
FACET_CLASS1 = ("guitarist", "lawman", "doctor", "waiter", "astronaut")
CARLA_SIZE = (96, 56)  # (width, height) of every CARLA frame


@dataclass
class Person:
    image: int  # index of its image in the fixture's image list
    box: tuple[float, float, float, float]  # x, y, w, h pixels (top-left corner)
    mst: int  # 1..10, 0 = unknown
    person_id: int = -1
    class1: str = "person"
    lighting: int = -1  # FACET lighting id (well_lit 0 .. overexposed 3), -1 = na


@dataclass
class Fixture:
    root: Path
    names: list[str]  # image file name (FACET) or frame (CARLA), in reader order
    sizes: list[tuple[int, int]]  # (width, height)
    persons: list[Person]
    splits: list[str] = field(default_factory=list)  # CARLA: split of each frame
    conditions: list[tuple[str, int]] = field(default_factory=list)  # CARLA: (weather, intensity) of each frame

    def persons_of(self, image: int) -> list[Person]:
        return [p for p in self.persons if p.image == image]


def _draw(width: int, height: int, persons: list[Person]) -> np.ndarray:
    img = np.empty((height, width, 3), np.uint8)
    img[:] = BACKGROUND_RGB
    for p in persons:
        x, y, w, h = (int(round(v)) for v in p.box)
        colour = person_rgb(p.mst)
        img[y : y + h, x : x + w] = colour
    return img


def person_rgb(mst: int) -> np.ndarray:
    """Fill colour of a person: its MST swatch, or UNKNOWN_RGB."""
    return MST_RGB[mst - 1] if mst else np.array(UNKNOWN_RGB, np.uint8)


def _layout(rng: np.random.Generator, width: int, height: int, n: int) -> list[tuple[float, float, float, float]]:
    """n non-overlapping boxes in vertical slots, each with a gap of at least 4 px to its neighbours and borders."""
    slot = width / n
    boxes = []
    for k in range(n):
        w = float(rng.integers(max(6, int(slot * 0.35)), max(7, int(slot - 8))))
        h = float(rng.integers(int(height * 0.35), int(height * 0.8)))
        x = float(np.floor(k * slot + 4 + rng.uniform(0, max(0.0, slot - 8 - w))))
        y = float(rng.integers(4, int(height - h - 4) + 1))
        boxes.append((x, y, w, h))
    return boxes


def write_facet_fixture(root: Path, n_images: int = 40, seed: int = 0, max_persons: int = 3,
                        na_probability: float = 0.15) -> Fixture:
    """FACET layout: annotations/annotations.csv with all 52 documented columns + sa_<n>.jpg in imgs_1..3."""
    rng = np.random.default_rng(seed)
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    names, sizes, persons = [], [], []
    for i in range(n_images):
        width, height = FACET_SIZES[i % len(FACET_SIZES)]
        name = f"sa_{1000 + i}.jpg"
        n = int(rng.integers(1, max_persons + 1))
        own = []
        for box in _layout(rng, width, height, n):
            mst = 0 if rng.random() < na_probability else int(rng.integers(1, 11))
            own.append(Person(image=i, box=box, mst=mst, person_id=len(persons) + len(own) + 1,
                              class1=FACET_CLASS1[int(rng.integers(len(FACET_CLASS1)))],
                              lighting=int(rng.integers(-1, 4))))
        folder = root / f"imgs_{i % 3 + 1}"
        folder.mkdir(exist_ok=True)
        Image.fromarray(_draw(width, height, own)).save(folder / name, quality=95, subsampling=0)
        names.append(name)
        sizes.append((width, height))
        persons += own
    with open(root / "annotations" / "annotations.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(FACET_CSV_COLUMNS), restval=0, lineterminator="\n")
        writer.writeheader()
        for p in persons:
            writer.writerow(facet_row(p, names[p.image], rng))
    return Fixture(root=root, names=names, sizes=sizes, persons=persons)


def skin_counts(mst: int) -> dict[str, int]:
    """Annotator counts whose weighted mean is exactly `mst` (symmetric picks), or only skin_tone_na for 0."""
    if mst == 0:
        return {"skin_tone_na": 3}
    if mst in (1, 10):
        return {f"skin_tone_{mst}": 3}
    return {f"skin_tone_{mst - 1}": 1, f"skin_tone_{mst}": 2, f"skin_tone_{mst + 1}": 1}


def facet_row(p: Person, filename: str, rng: np.random.Generator) -> dict:
    x, y, w, h = p.box
    row = {"person_id": p.person_id, "filename": filename, "class1": p.class1, "class2": "",
           "bounding_box": json.dumps({"x": x, "y": y, "width": w, "height": h}), **skin_counts(p.mst)}
    row[LIGHTING_COLUMNS[p.lighting] if p.lighting >= 0 else "lighting_na"] = 1
    row[("gender_presentation_masc", "gender_presentation_fem", "gender_presentation_na")[int(rng.integers(3))]] = 1
    row[("age_presentation_young", "age_presentation_middle", "age_presentation_older")[int(rng.integers(3))]] = 1
    row["visible_face"] = row["visible_torso"] = 1
    return row


def write_carla_fixture(root: Path, n_finetune: int = 40, n_eval: int = 13, n_attack: int = 4, seed: int = 0,
                        unknown_probability: float = 0.15) -> Fixture:
    """CARLA layout of data/carla.py: images/ and labels/ per split, metadata.csv, pedestrians.csv.

    finetune frames are clear, eval frames cycle through the 13 weather conditions, attack frames are clear; some
    frames have no pedestrian and some pedestrians have no MST row (unknown).
    """
    rng = np.random.default_rng(seed)
    width, height = CARLA_SIZE
    towns = ("Town01", "Town03", "Town05")
    frames = ([("finetune", ("clear", 0))] * n_finetune
              + [("eval", WEATHER_CONDITIONS[k % len(WEATHER_CONDITIONS)]) for k in range(n_eval)]
              + [("attack", ("clear", 0))] * n_attack)
    names, sizes, persons, splits, conditions = [], [], [], [], []
    meta = ["frame,split,town,weather,intensity"]
    peds = ["frame,ped_index,mst"]
    for i, (split, (weather, intensity)) in enumerate(frames):
        frame = f"{split[0]}{i:04d}"
        n = int(rng.integers(0, 4)) if i % 7 == 3 else int(rng.integers(1, 4))  # a few frames without pedestrians
        own = [Person(image=i, box=box, mst=0 if rng.random() < unknown_probability else int(rng.integers(1, 11)))
               for box in (_layout(rng, width, height, n) if n else [])]
        for d in ("images", "labels"):
            (root / d / split).mkdir(parents=True, exist_ok=True)
        Image.fromarray(_draw(width, height, own)).save(root / "images" / split / f"{frame}.png")
        lines = []
        for k, p in enumerate(own):
            x, y, w, h = p.box
            lines.append(f"0 {(x + w / 2) / width:.6f} {(y + h / 2) / height:.6f} {w / width:.6f} {h / height:.6f} "
                         f"{100 * i + k}")
            if p.mst:
                peds.append(f"{frame},{k},{p.mst}")
        (root / "labels" / split / f"{frame}.txt").write_text("".join(line + "\n" for line in lines))
        meta.append(f"{frame},{split},{towns[i % 3]},{weather},{intensity}")
        names.append(frame)
        sizes.append((width, height))
        persons += own
        splits.append(split)
        conditions.append((weather, intensity))
    (root / "metadata.csv").write_text("\n".join(meta) + "\n")
    (root / "pedestrians.csv").write_text("\n".join(peds) + "\n")
    return Fixture(root=root, names=names, sizes=sizes, persons=persons, splits=splits, conditions=conditions)
