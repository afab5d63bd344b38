"""Reader for CARLA pedestrian frames exported in YOLO format with a metadata table.

Expected layout under the root:
    images/<split>/<frame>.png | .jpg | .jpeg
    labels/<split>/<frame>.txt     one line per pedestrian: "cls xc yc w h [ped_id]" (YOLO, normalised to [0, 1];
                                   optional 6th column = CARLA pedestrian/actor id); an empty file = no pedestrian
    metadata.csv                   header frame,split,town,weather,intensity; one row per frame (frame = file stem,
                                   unique over all splits); town in Town01/Town03/Town05, weather in
                                   clear/cloud/rain/fog, intensity in 0/25/50/75/100 (% ; 0 exactly for clear)
    pedestrians.csv                header frame,ped_index,mst; ped_index = 0-based position of the box among the
                                   label file's non-empty lines; mst = Monk Skin Tone 1..10 (0 = unknown).
                                   Boxes without a row get MST 0 (unknown, group -1).
Per-image metadata (frame, split, town, weather, intensity, condition = index in WEATHER_CONDITIONS) is returned in
`image_meta`; per person, proxy = that condition index and person_meta["ped_id"] the 6th column (-1 when absent).
Row numbers in messages count the CSV header as row 1; label files are numbered by line from 1.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from resfl_lightning.data.errors import AnnotationError
from resfl_lightning.data.mst import GROUPINGS
from resfl_lightning.data.records import (
    BadInput,
    DetectionRecords,
    clip_box_xyxy,
    mst_to_group,
    read_image_size,
)
from resfl_lightning.data.weather import WEATHER_CONDITIONS, WEATHER_INTENSITIES, WEATHER_TYPES, condition_index

CARLA_TOWNS = ("Town01", "Town03", "Town05")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
METADATA_COLUMNS = ("frame", "split", "town", "weather", "intensity")
PEDESTRIAN_COLUMNS = ("frame", "ped_index", "mst")
CARLA_LAYOUT = (
    "expected CARLA export layout: <root>/images/<split>/<frame>.png|jpg, <root>/labels/<split>/<frame>.txt "
    "(YOLO 'cls xc yc w h [ped_id]'), <root>/metadata.csv (frame,split,town,weather,intensity) and "
    "<root>/pedestrians.csv (frame,ped_index,mst)"
)


def load_carla(
    root: str | Path,
    *,
    split: str | Sequence[str] | None = None,
    grouping: str = "mst10",
    class_names: Sequence[str] = ("person",),
    on_error: str = "raise",
    box_tolerance: float = 0.02,
    verify_images: bool = False,
    towns: Sequence[str] = CARLA_TOWNS,
) -> DetectionRecords:
    """Read CARLA frames (all splits, or those named by `split`) into DetectionRecords, in metadata.csv order.

    on_error="raise" raises at the first problem (FileNotFoundError for missing files, ValueError otherwise, naming
    the file and row/line); "skip" drops every frame with a problem and records one message per problem in `skipped`.
    Boxes sticking out of the image by at most `box_tolerance` x side + 1 px are clipped; larger overhangs are errors.
    """
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"CARLA root {root} does not exist; {CARLA_LAYOUT}")
    for name in ("metadata.csv", "pedestrians.csv"):
        if not (root / name).is_file():
            raise FileNotFoundError(f"{root / name} is missing; {CARLA_LAYOUT}")
    splits = None if split is None else ({split} if isinstance(split, str) else set(split))
    problems = BadInput(on_error)
    bad_frames: set[str] = set()

    frames, all_frames = _read_metadata(root / "metadata.csv", splits, set(towns), problems, bad_frames)
    mst_of = _read_pedestrians(root / "pedestrians.csv", frames, all_frames, problems, bad_frames)

    images, sizes, meta_rows = [], [], []
    labels: list[tuple] = []  # (cls, xc, yc, w, h, ped_id) per person
    image_index, mst = [], []
    for frame, info in frames.items():
        if frame in bad_frames:
            continue
        peds = mst_of[frame] if frame in mst_of else {}  # a frame without pedestrians.csv rows
        loaded = _load_frame(root, frame, info, len(class_names), peds, box_tolerance, verify_images, problems)
        if loaded is None:
            continue
        path, size, boxes = loaded
        labels += boxes
        image_index += [len(images)] * len(boxes)
        mst += [peds[i][0] if i in peds else 0 for i in range(len(boxes))]  # 0: MST unknown
        images.append(path)
        sizes.append(size)
        meta_rows.append((frame, info["split"], info["town"], info["weather"], info["intensity"]))
    return _build(images, sizes, meta_rows, labels, image_index, mst, list(class_names), grouping, problems.messages)


def _read_table(path: Path, columns: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    """[(row number, {column: stripped value})] of a CSV with the required `columns` (header = row 1)."""
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = [h.strip().lstrip("\ufeff") for h in next(reader, [])]
        missing = [c for c in columns if c not in header]
        if missing:
            raise AnnotationError(f"{path} row 1 (header) lacks required columns {missing}; {CARLA_LAYOUT}")
        rows = []
        for fields in reader:
            if not any(f.strip() for f in fields):
                continue
            values = {h: f.strip() for h, f in zip(header, fields, strict=False)}
            values.setdefault("frame", "")
            if len(fields) != len(header):  # reported by the caller, which knows what the row is about
                values["_error"] = f"has {len(fields)} fields, the header has {len(header)}"
            rows.append((reader.line_num, values))
    return rows


def _read_metadata(
    path: Path, splits: set[str] | None, towns: set[str], problems: BadInput, bad_frames: set[str]
) -> tuple[dict[str, dict], set[str]]:
    """(frame -> {line, split, town, weather, intensity} for the selected splits in file order, all frame names)."""
    frames: dict[str, dict] = {}
    first_line: dict[str, int] = {}
    for line, values in _read_table(path, METADATA_COLUMNS):
        frame = values["frame"]
        where = f"{path} row {line} (frame {frame or '?'})"
        if frame in first_line:
            problems.report(f"{where}: duplicate frame (first at row {first_line[frame]})")
            bad_frames.add(frame)
            continue
        first_line[frame] = line
        if "_error" in values:
            problems.report(f"{where}: {values['_error']}")
            bad_frames.add(frame)
            continue
        if splits is not None and values["split"] not in splits:
            continue
        error = _metadata_error(values, towns)
        if error:
            problems.report(f"{where}: {error}")
            bad_frames.add(frame)
            continue
        frames[frame] = {"line": line, **{c: values[c] for c in METADATA_COLUMNS}}
        frames[frame]["intensity"] = int(values["intensity"])
    return frames, set(first_line)


def _metadata_error(values: dict[str, str], towns: set[str]) -> str:
    if not values["frame"] or "/" in values["frame"] or "\\" in values["frame"] or values["frame"] in (".", ".."):
        return f"invalid frame name {values['frame']!r}"
    if not values["split"] or "/" in values["split"] or values["split"] in (".", ".."):
        return f"invalid split {values['split']!r}"
    if values["town"] not in towns:
        return f"unknown town {values['town']!r} (expected one of {sorted(towns)})"
    if values["weather"] not in WEATHER_TYPES:
        return f"unknown weather {values['weather']!r} (expected one of {WEATHER_TYPES})"
    try:
        intensity = int(values["intensity"])
    except ValueError:
        return f"intensity {values['intensity']!r} is not an integer"
    if intensity not in WEATHER_INTENSITIES:
        return f"intensity {intensity} is not one of {WEATHER_INTENSITIES}"
    if (values["weather"], intensity) not in WEATHER_CONDITIONS:
        return f"({values['weather']}, {intensity}) is not a weather condition (clear has intensity 0, others > 0)"
    return ""


def _read_pedestrians(
    path: Path, frames: dict[str, dict], all_frames: set[str], problems: BadInput, bad_frames: set[str]
) -> dict[str, dict[int, tuple[int, int]]]:
    """frame -> {ped_index: (mst, row)} for the selected frames."""
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for line, row in _read_table(path, PEDESTRIAN_COLUMNS):
        frame = row["frame"]
        where = f"{path} row {line} (frame {frame or '?'})"
        if "_error" in row:
            problems.report(f"{where}: {row['_error']}")
            bad_frames.add(frame)
            continue
        if frame not in all_frames:
            problems.report(f"{where}: frame is not listed in metadata.csv")
            continue
        if frame not in frames:  # another split, or a frame already known to be bad
            continue
        try:
            ped, mst = int(row["ped_index"]), int(row["mst"])
        except ValueError:
            problems.report(f"{where}: ped_index and mst must be integers, got {row['ped_index']!r}, {row['mst']!r}")
            bad_frames.add(frame)
            continue
        if ped < 0:
            error = f"ped_index must be >= 0, got {ped}"
        elif not 0 <= mst <= 10:
            error = f"mst must be 0 (unknown) or 1..10, got {mst}"
        elif frame in out and ped in out[frame]:
            error = f"duplicate ped_index {ped} (first at row {out[frame][ped][1]})"
        else:
            error = ""
        if error:
            problems.report(f"{where}: {error}")
            bad_frames.add(frame)
            continue
        out.setdefault(frame, {})[ped] = (mst, line)
    return out


def _load_frame(
    root: Path, frame: str, info: dict, num_classes: int, peds: dict[int, tuple[int, int]], box_tolerance: float,
    verify: bool, problems: BadInput,
) -> tuple[Path, tuple[int, int], list[tuple]] | None:
    """Image path, (height, width) and [(cls, xc, yc, w, h, ped_id)] of one frame; None after reporting a problem."""
    where = f"{root / 'metadata.csv'} row {info['line']} (frame {frame})"
    folder = root / "images" / info["split"]
    path = next((folder / f"{frame}{s}" for s in IMAGE_SUFFIXES if (folder / f"{frame}{s}").is_file()), None)
    if path is None:
        problems.report(f"{where}: no image {frame}{{{','.join(IMAGE_SUFFIXES)}}} in {folder}", missing_file=True)
        return None
    try:
        height, width = read_image_size(path, verify=verify)
    except ValueError as err:
        problems.report(f"{where}: {err}")
        return None
    label_path = root / "labels" / info["split"] / f"{frame}.txt"
    if not label_path.is_file():
        problems.report(f"{where}: label file {label_path} is missing (write an empty file for a frame without "
                        "pedestrians)", missing_file=True)
        return None
    boxes: list[tuple] = []
    ok = True
    with open(label_path, encoding="utf-8") as fh:
        for line_no, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            parsed = _parse_label_line(text, num_classes, width, height, box_tolerance)
            if isinstance(parsed, str):
                problems.report(f"{label_path} line {line_no} ({where}): {parsed}")
                ok = False
                continue
            boxes.append(parsed)
    beyond = [p for p in peds if p >= len(boxes)]
    if ok and beyond:
        problems.report(f"{root / 'pedestrians.csv'} row {peds[beyond[0]][1]} (frame {frame}): ped_index "
                        f"{beyond[0]} but {label_path} has {len(boxes)} boxes (ped_index is 0-based)")
        ok = False
    return (path, (height, width), boxes) if ok else None


def _parse_label_line(text: str, num_classes: int, width: int, height: int, tolerance: float) -> tuple | str:
    """(cls, xc, yc, w, h, ped_id) with the box clipped to the image, or the problem as a string."""
    parts = text.split()
    if len(parts) not in (5, 6):
        return f"expected 5 or 6 fields 'cls xc yc w h [ped_id]', got {len(parts)}: {text.strip()!r}"
    try:
        cls = int(parts[0])
        xc, yc, w, h = (float(v) for v in parts[1:5])
        ped_id = int(parts[5]) if len(parts) == 6 else -1
    except ValueError:
        return f"non-numeric field in {text.strip()!r}"
    if not 0 <= cls < num_classes:
        return f"class {cls} outside 0..{num_classes - 1}"
    if not all(math.isfinite(v) for v in (xc, yc, w, h)) or w <= 0 or h <= 0:
        return f"box {text.strip()!r} is not finite or has a non-positive size"
    clipped = clip_box_xyxy((xc - w / 2) * width, (yc - h / 2) * height, (xc + w / 2) * width,
                            (yc + h / 2) * height, width, height, tolerance)
    if isinstance(clipped, str):
        return clipped
    x1, y1, x2, y2 = clipped
    return (cls, (x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height, ped_id)


def _build(
    images: list[Path], sizes: list[tuple[int, int]], meta_rows: list[tuple], labels: list[tuple],
    image_index: list[int], mst: list[int], class_names: list[str], grouping: str, skipped: list[str],
) -> DetectionRecords:
    index = np.array(image_index, dtype=np.int64)
    mst_arr = np.array(mst, dtype=np.int64)
    weather = np.array([m[3] for m in meta_rows], dtype=object)
    intensity = np.array([m[4] for m in meta_rows], dtype=np.int64)
    condition = np.array([condition_index(w, i) for w, i in zip(weather, intensity, strict=True)], dtype=np.int64)
    records = DetectionRecords(
        image_paths=images,
        image_sizes=np.array(sizes, dtype=np.int64).reshape(-1, 2),
        image_index=index,
        cls=np.array([b[0] for b in labels], dtype=np.int64),
        boxes_xywhn=np.array([b[1:5] for b in labels], dtype=np.float32).reshape(-1, 4),
        mst=mst_arr,
        groups=mst_to_group(mst_arr, grouping),
        proxy=condition[index],
        class_names=class_names,
        skipped=list(skipped),
        image_meta={
            "frame": np.array([m[0] for m in meta_rows], dtype=object),
            "split": np.array([m[1] for m in meta_rows], dtype=object),
            "town": np.array([m[2] for m in meta_rows], dtype=object),
            "weather": weather,
            "intensity": intensity,
            "condition": condition,
        },
        person_meta={"ped_id": np.array([b[5] for b in labels], dtype=np.int64)},
    )
    return records.validate()
