"""A detection set in the ultralytics dataset format plus a groups CSV, as images + person annotations with groups.

data.yaml names the image folders (`train`, `val`, optional `test`, relative to its `path` key or to the yaml's own
folder); each image `.../images/<split>/<name>.jpg` has its labels in `.../labels/<split>/<name>.txt`, one row
`class cx cy w h` (normalised) per object. Only boxes of the person class are kept (class 0 in training). The groups
CSV gives a group per person: columns `image` (file name, or path relative to the dataset folder), `group`, and
either `box` (0-based row of the image's label file) or `x, y, w, h` (the box as written in the label file), or
neither (every person of the image gets the image's group); an optional extra column names each image's client for
partition=column. Every problem stops the load with a message naming the file, line and column; nothing is written.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from resfl_lightning.data.errors import AnnotationError, MissingDataFile
from resfl_lightning.data.records import read_image_size

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
BOX_MATCH = 1e-4  # x, y, w, h of the groups file must equal the label row's within this (printing rounds them)


@dataclass
class YoloSet:
    """Images (paths, (h, w) sizes, split name) and their person boxes with groups, plus the partition labels."""

    image_paths: list[Path]
    image_sizes: np.ndarray  # int64 (N, 2)
    image_split: np.ndarray  # str (N,) train | val | test
    image_index: np.ndarray  # int64 (M,)
    boxes: np.ndarray  # float32 (M, 4) normalised xywh
    groups: np.ndarray  # int64 (M,), -1 = no group given
    group_names: list[str]
    client_labels: np.ndarray | None = None  # str (N,) per image
    class_names: list[str] = field(default_factory=lambda: ["person"])


def _split_dirs(data_yaml: Path) -> dict[str, Path]:
    try:
        spec = yaml.safe_load(data_yaml.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise AnnotationError(f"{data_yaml}: cannot read the dataset yaml: {err}") from None
    if not isinstance(spec, dict) or "train" not in spec:
        raise AnnotationError(f"{data_yaml}: expected a mapping with at least a 'train' image folder (ultralytics "
                              "format)")
    base = Path(str(spec.get("path") or data_yaml.parent)).expanduser()
    base = base if base.is_absolute() else data_yaml.parent / base
    out = {}
    for split in ("train", "val", "test"):
        value = spec.get(split)
        if value in (None, ""):
            continue
        if not isinstance(value, str):
            raise AnnotationError(f"{data_yaml} key {split}: give one image folder, got {value!r}")
        folder = (base / value).resolve()
        if not folder.is_dir():
            raise AnnotationError(f"{data_yaml} key {split}: image folder {folder} does not exist")
        out[split] = folder
    return out


def label_path(image: Path) -> Path:
    """ultralytics' rule: the last /images/ of the path becomes /labels/, the suffix .txt."""
    parts = list(image.parts)
    if "images" not in parts:
        raise AnnotationError(f"{image}: not under an 'images' folder, so its label file cannot be found")
    k = len(parts) - 1 - parts[::-1].index("images")
    parts[k] = "labels"
    return Path(*parts).with_suffix(".txt")


def read_label_file(path: Path, person_class: int, tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """(row numbers, float32 (k, 4) boxes) of the person rows; AnnotationError names file and line of a bad row."""
    rows, boxes = [], []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            cls, values = int(fields[0]), [float(v) for v in fields[1:]]
        except (ValueError, IndexError):
            raise AnnotationError(f"{path} line {line_no}: expected 'class cx cy w h' (an integer and four numbers), "
                                  f"got {line.strip()[:80]!r}") from None
        if len(values) != 4 or not np.isfinite(values).all():
            raise AnnotationError(f"{path} line {line_no}: expected 'class cx cy w h' (an integer and four finite "
                                  f"numbers), got {line.strip()[:80]!r}")
        cx, cy, w, h = values
        lo, hi = min(cx - w / 2, cy - h / 2), max(cx + w / 2, cy + h / 2)
        if w <= 0 or h <= 0 or lo < -tolerance or hi > 1 + tolerance:
            raise AnnotationError(f"{path} line {line_no}: box cx={cx:g} cy={cy:g} w={w:g} h={h:g} lies outside the "
                                  f"image (normalised [0, 1], tolerance {tolerance:g}) or is empty")
        if cls == person_class:
            rows.append(line_no - 1)
            boxes.append(values)
    return np.asarray(rows, np.int64), np.asarray(boxes, np.float32).reshape(-1, 4)


def _read_groups(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise MissingDataFile(f"{path}: groups file not found")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise AnnotationError(f"{path}: the groups file is empty (expected a header: image,group,...)") from None
    except (pd.errors.ParserError, UnicodeDecodeError):
        raise AnnotationError(_malformed_line(path)) from None
    frame.columns = [c.strip() for c in frame.columns]
    for column in ("image", "group"):
        if column not in frame.columns:
            raise AnnotationError(f"{path}: no column {column!r} (columns: {', '.join(frame.columns)})")
    return frame


def _malformed_line(path: Path) -> str:
    """The first line whose field count differs from the header's (what pandas stops at), as an error message."""
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        reader = csv.reader(fh, skipinitialspace=True)
        header = next(reader, [])
        for fields in reader:
            if fields and len(fields) != len(header):
                return (f"{path} line {reader.line_num}: {len(fields)} fields, but the header "
                        f"({','.join(header)}) has {len(header)}")
    return f"{path}: cannot be read as CSV text (UTF-8, comma-separated, a header line first)"


def group_order(frame: pd.DataFrame, listed: list[str] | None) -> list[str]:
    """The group names in group-id order: the listed ones (dataset.groups), else the groups file's sorted."""
    return list(listed) if listed else sorted(set(frame["group"]) - {""})


def read_group_names(groups_file: Path, listed: list[str] | None = None) -> list[str]:
    """The group names of a groups file as load_yolo numbers them, without reading the images or labels."""
    return group_order(_read_groups(Path(groups_file)), listed)


def _line(k: int) -> str:
    return f"line {k + 2}"  # header is line 1


def load_yolo(data_yaml: Path, groups_file: Path, person_class: int = 0, listed_groups: list[str] | None = None,
              partition_column: str | None = None, box_tolerance: float = 0.0) -> YoloSet:
    """Read the images, person boxes and groups; see the module docstring for the formats."""
    dirs = _split_dirs(Path(data_yaml))
    paths, splits = [], []
    for split, folder in dirs.items():
        found = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            raise AnnotationError(f"{data_yaml} key {split}: no image in {folder}")
        paths += found
        splits += [split] * len(found)
    image_of = {}
    for i, p in enumerate(paths):
        image_of.setdefault(p.name, i)
        image_of[str(p)] = i
    box_rows, boxes, owner = [], [], []
    for i, p in enumerate(paths):
        lp = label_path(p)
        if not lp.is_file():
            raise AnnotationError(f"{p}: image without a label file (expected {lp}; an image without objects needs an "
                                  "empty one)")
        rows, b = read_label_file(lp, person_class, box_tolerance)
        box_rows.append(rows)
        boxes.append(b)
        owner.append(np.full(len(rows), i, np.int64))
    image_index = np.concatenate(owner)
    all_boxes = np.concatenate(boxes)
    first = np.cumsum([0] + [len(r) for r in box_rows])
    frame = _read_groups(Path(groups_file))
    by_box = "box" in frame.columns
    by_coords = all(c in frame.columns for c in ("x", "y", "w", "h"))
    if partition_column is not None and partition_column not in frame.columns:
        raise AnnotationError(f"{groups_file}: no column {partition_column!r} (dataset.partition_column)")
    names = group_order(frame, listed_groups)
    group_id = {g: k for k, g in enumerate(names)}
    groups = np.full(len(image_index), -1, np.int64)
    client = np.full(len(paths), "", dtype=object)
    for k, row in enumerate(frame.itertuples(index=False)):
        rec = row._asdict()
        image = rec["image"].strip()
        i = image_of.get(image, image_of.get(str((Path(data_yaml).parent / image).resolve())))
        if i is None:
            raise AnnotationError(f"{groups_file} {_line(k)} column 'image': {image!r} is not an image of {data_yaml}")
        if rec["group"] not in group_id:
            raise AnnotationError(f"{groups_file} {_line(k)} column 'group': {rec['group']!r} is not among the groups "
                                  f"({', '.join(names)})")
        persons = np.arange(first[i], first[i + 1])
        if by_box and rec["box"].strip() != "":
            try:
                hit = persons[box_rows[i] == int(rec["box"])]
            except ValueError:
                raise AnnotationError(f"{groups_file} {_line(k)} column 'box': {rec['box']!r} is not a row "
                                      "number") from None
            if hit.size == 0:
                raise AnnotationError(f"{groups_file} {_line(k)} column 'box': row {rec['box']} of "
                                      f"{label_path(paths[i])} is not a person box (class {person_class})")
        elif by_coords and rec["x"].strip() != "":
            try:
                xywh = np.array([float(rec[c]) for c in ("x", "y", "w", "h")], np.float32)
            except ValueError:
                raise AnnotationError(f"{groups_file} {_line(k)} columns x, y, w, h: not numbers") from None
            hit = persons[np.abs(all_boxes[persons] - xywh).max(axis=1) <= BOX_MATCH] if persons.size else persons
            if hit.size == 0:
                raise AnnotationError(f"{groups_file} {_line(k)} columns x, y, w, h: no person box of "
                                      f"{label_path(paths[i])} matches {xywh.tolist()}")
        else:
            hit = persons
        groups[hit] = group_id[rec["group"]]
        if partition_column is not None:
            client[i] = str(rec[partition_column]).strip()
    if partition_column is not None and (client == "").any():
        missing = paths[int(np.flatnonzero(client == "")[0])]
        raise AnnotationError(f"{groups_file}: no {partition_column!r} value for image {missing.name} "
                              "(partition=column needs one per image)")
    sizes = np.array([read_image_size(p) for p in paths], np.int64).reshape(-1, 2)
    return YoloSet(image_paths=paths, image_sizes=sizes, image_split=np.asarray(splits), image_index=image_index,
                   boxes=all_boxes, groups=groups, group_names=names,
                   client_labels=client.astype(str) if partition_column is not None else None)
