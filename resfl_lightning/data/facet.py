"""Reader for FACET (Meta AI, Gustafson et al. 2023) exactly as Meta ships it; no conversion step.

Layout under the root (argument, or env var FACET_ROOT as a fallback):
    annotations/annotations.csv     one row per person (columns: FACET's annotations/README.txt; those read here below)
    annotations/coco_boxes.json     optional; when present, image sizes are cross-checked against it
    imgs_1/ imgs_2/ imgs_3/         sa_<n>.jpg

Per person: box from `bounding_box` (pixels, top-left x/y, width, height) normalised by the image size read from the
JPEG header; MST = count-weighted mean of the chosen `skin_tone_1..10` values rounded half up (4.5 -> 5), 0 (unknown,
group -1) when no value was chosen (only `skin_tone_na`); proxy = lighting (well_lit 0, dimly_lit 1, underexposed 2,
overexposed 3, na or ambiguous -1). Row numbers in messages are CSV line numbers (the header is row 1).
"""

from __future__ import annotations

import ast
import csv
import json
import math
import os
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

FACET_DOWNLOAD_URL = "https://ai.meta.com/datasets/facet-downloads/"
FACET_ROOT_ENV = "FACET_ROOT"
FACET_IMAGE_DIRS = ("imgs_1", "imgs_2", "imgs_3")
FACET_CSV = Path("annotations") / "annotations.csv"
FACET_COCO_BOXES = Path("annotations") / "coco_boxes.json"

FACET_LICENCE_NOTICE = (
    "FACET (Meta AI, Gustafson et al., ICCV 2023) is licensed by Meta under the FACET Data License for research use "
    "only, and Meta describes it as a benchmark for evaluating the fairness and robustness of vision models. "
    "You must have requested FACET and accepted its licence yourself, and check that your use (including any "
    "training on it) is permitted by that licence. FACET images and annotations must not be redistributed: "
    "do not commit, upload or share them."
)

SKIN_TONE_COLUMNS = tuple(f"skin_tone_{k}" for k in range(1, 11))
LIGHTING_NAMES = ("well_lit", "dimly_lit", "underexposed", "overexposed")
LIGHTING_COLUMNS = tuple(f"lighting_{n}" for n in LIGHTING_NAMES) + ("lighting_na",)
GENDER_COLUMNS = ("gender_presentation_masc", "gender_presentation_fem", "gender_presentation_non_binary")
AGE_COLUMNS = ("age_presentation_young", "age_presentation_middle", "age_presentation_older")

# The 52 columns public loaders read from annotations.csv (order unverified; read by name).
FACET_CSV_COLUMNS = (
    "person_id", "filename", "class1", "class2", "bounding_box",
    *GENDER_COLUMNS, "gender_presentation_na",
    *SKIN_TONE_COLUMNS, "skin_tone_na",
    *AGE_COLUMNS, "age_presentation_na",
    "hair_color_black", "hair_color_blonde", "hair_color_brown", "hair_color_red", "hair_color_colored",
    "hair_color_grey", "hair_color_na",
    "hairtype_wavy", "hairtype_curly", "hairtype_straight", "hairtype_coily", "hairtype_dreadlocks", "hairtype_bald",
    "hairtype_na",
    "has_facial_hair", "has_tattoo", "has_cap", "has_mask", "has_headscarf", "has_eyeware",
    "visible_torso", "visible_face", "visible_minimal",
    *LIGHTING_COLUMNS,
)  # fmt: skip
# Columns the reader needs; the other documented attributes are not required.
REQUIRED_COLUMNS = ("person_id", "filename", "class1", "bounding_box", *SKIN_TONE_COLUMNS, *LIGHTING_COLUMNS)

# class1 labels, sorted: the class ids of classes="class1".
FACET_CLASSES = tuple(sorted((
    "astronaut", "backpacker", "ballplayer", "bartender", "basketball_player", "boatman", "carpenter", "cheerleader",
    "climber", "computer_user", "craftsman", "dancer", "disk_jockey", "doctor", "drummer", "electrician", "farmer",
    "fireman", "flutist", "gardener", "guard", "guitarist", "gymnast", "hairdresser", "horseman", "judge", "laborer",
    "lawman", "lifeguard", "machinist", "motorcyclist", "nurse", "painter", "patient", "prayer", "referee",
    "repairman", "reporter", "retailer", "runner", "sculptor", "seller", "singer", "skateboarder", "soccer_player",
    "soldier", "speaker", "student", "teacher", "tennis_player", "trumpeter", "waiter",
)))  # fmt: skip
CLASS_MODES = ("person", "class1")


def facet_missing_message(root: str | Path | None) -> str:
    """Explain where FACET comes from and the layout this reader expects."""
    where = f"FACET was not found at {root}" if root is not None else (
        f"No FACET root given (dataset root in the config, or env var {FACET_ROOT_ENV})")
    return (
        f"{where}. FACET is distributed by Meta behind a request form: request and download it from "
        f"{FACET_DOWNLOAD_URL} (accepting its licence), unpack it, and pass that folder as the FACET root "
        f"(config) or set {FACET_ROOT_ENV}. Expected layout, as Meta ships it:\n"
        "  <root>/annotations/annotations.csv\n"
        "  <root>/annotations/coco_boxes.json   (optional)\n"
        "  <root>/imgs_1/sa_<n>.jpg, <root>/imgs_2/..., <root>/imgs_3/...\n"
        + FACET_LICENCE_NOTICE
    )


def resolve_facet_root(root: str | Path | None = None) -> Path:
    """The FACET root: the argument, else $FACET_ROOT; FileNotFoundError with download help when absent."""
    if root is None or str(root) == "":
        root = os.environ.get(FACET_ROOT_ENV) or None
    if root is None:
        raise FileNotFoundError(facet_missing_message(None))
    path = Path(root).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(facet_missing_message(path))
    if not (path / FACET_CSV).is_file():
        raise FileNotFoundError(f"{path / FACET_CSV} is missing. " + facet_missing_message(path))
    return path


def mst_from_counts(counts: np.ndarray | Sequence[Sequence[int]]) -> np.ndarray:
    """MST label per person from the ten annotator counts: round-half-up of the count-weighted mean; 0 if none.

    Exact integer arithmetic: floor(S / C + 1/2) = floor((2 S + C) / (2 C)), S = sum k c_k, C = sum c_k.
    """
    c = np.asarray(counts, dtype=np.int64)
    if c.ndim != 2 or c.shape[1] != 10:
        raise ValueError(f"skin-tone counts must have shape (M, 10), got {c.shape}")
    if (c < 0).any():
        raise ValueError("skin-tone counts must be non-negative")
    total = c.sum(axis=1)
    weighted = c @ np.arange(1, 11, dtype=np.int64)
    safe = np.maximum(total, 1)
    return np.where(total > 0, (2 * weighted + total) // (2 * safe), 0).astype(np.int64)


def parse_bounding_box(text: str) -> tuple[float, float, float, float]:
    """`bounding_box` cell (JSON or Python dict literal with x, y, width, height) -> (x, y, w, h) pixels."""
    try:
        box = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        try:
            box = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
            raise ValueError(f"unparsable bounding_box {text!r}") from err
    if not isinstance(box, dict) or any(k not in box for k in ("x", "y", "width", "height")):
        raise ValueError(f"bounding_box must be a dict with keys x, y, width, height, got {text!r}")
    try:
        values = tuple(float(box[k]) for k in ("x", "y", "width", "height"))
    except (TypeError, ValueError) as err:
        raise ValueError(f"bounding_box {text!r} has non-numeric values") from err
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"bounding_box {text!r} has non-finite values")
    if values[2] <= 0 or values[3] <= 0:
        raise ValueError(f"bounding_box {text!r} has a non-positive width or height")
    return values  # type: ignore[return-value]


def load_facet(
    root: str | Path | None = None,
    *,
    classes: str = "person",
    grouping: str = "mst10",
    on_error: str = "raise",
    box_tolerance: float = 0.02,
    verify_images: bool = False,
    image_dirs: Sequence[str] = FACET_IMAGE_DIRS,
) -> DetectionRecords:
    """Read FACET into DetectionRecords (one person per CSV row).

    classes: "person" (one class) or "class1" (the 52 class1 labels, sorted, as ids). grouping: "mst10" | "mst3".
    on_error: "raise" at the first bad row, or "skip" it (and every other person of the same image, so no image
    keeps an unlabelled person), recording one message per skipped row in `skipped`. Boxes sticking out of the image
    by at most `box_tolerance` x side + 1 px are clipped; larger overhangs are bad rows. verify_images decodes every
    image fully (slow) to catch truncated files; otherwise only the header is read.
    person_meta: person_id, class1 (index into FACET_CLASSES, -1 unknown), mst_mean (nan = unknown), and when the
    columns exist gender (masc 0, fem 1, non-binary 2) and age (young 0, middle 1, older 2), -1 = na/ambiguous.
    """
    if classes not in CLASS_MODES:
        raise ValueError(f"classes must be one of {CLASS_MODES}, got {classes!r}")
    if grouping not in GROUPINGS:
        raise ValueError(f"grouping must be one of {GROUPINGS}, got {grouping!r}")
    problems = BadInput(on_error)
    root = resolve_facet_root(root)
    csv_path = root / FACET_CSV
    images = _index_images(root, image_dirs)
    coco_sizes = _coco_image_sizes(root / FACET_COCO_BOXES)
    class_ids = {name: i for i, name in enumerate(FACET_CLASSES)}

    rows: list[dict] = []  # parsed good rows
    bad_images: dict[str, int] = {}  # filename -> first bad row
    size_cache: dict[str, tuple[int, int] | Exception] = {}
    seen_ids: dict[int, int] = {}
    with open(csv_path, "rb") as fh:
        reader = csv.reader(_checked_lines(fh, csv_path))
        header = next(reader, None)
        if header is None:
            raise AnnotationError(f"{csv_path} is empty (no header row)")
        header = [h.strip() for h in header]
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise AnnotationError(f"{csv_path} row 1 (header) lacks required columns {missing}")
        col = {name: i for i, name in enumerate(header)}
        has_gender = all(c in col for c in GENDER_COLUMNS)
        has_age = all(c in col for c in AGE_COLUMNS)
        for fields in reader:
            line = reader.line_num
            if not fields or all(not f.strip() for f in fields):
                continue
            filename = fields[col["filename"]].strip() if len(fields) > col["filename"] else ""
            where = f"{csv_path} row {line} (image {filename or '?'})"
            try:
                row = _parse_row(fields, col, len(header), has_gender, has_age, class_ids, classes)
            except ValueError as err:
                problems.report(f"{where}: {err}")
                bad_images.setdefault(filename, line)
                continue
            if row["person_id"] in seen_ids:
                problems.report(f"{where}: duplicate person_id {row['person_id']} (first at row "
                                f"{seen_ids[row['person_id']]})")
                bad_images.setdefault(filename, line)
                continue
            seen_ids[row["person_id"]] = line
            if filename not in size_cache:
                size_cache[filename] = _image_size(filename, images, coco_sizes, verify_images, image_dirs, root)
            size = size_cache[filename]
            if isinstance(size, Exception):
                problems.report(f"{where}: {size}", missing_file=isinstance(size, FileNotFoundError))
                bad_images.setdefault(filename, line)
                continue
            height, width = size
            x, y, w, h = row["box"]
            clipped = clip_box_xyxy(x, y, x + w, y + h, width, height, box_tolerance)
            if isinstance(clipped, str):
                problems.report(f"{where}: {clipped}")
                bad_images.setdefault(filename, line)
                continue
            x1, y1, x2, y2 = clipped
            row["xywhn"] = ((x1 + x2) / 2 / width, (y1 + y2) / 2 / height, (x2 - x1) / width, (y2 - y1) / height)
            row["line"], row["filename"], row["size"] = line, filename, size
            rows.append(row)

    skipped = list(problems.messages)
    kept = []
    for row in rows:
        if row["filename"] in bad_images:
            skipped.append(f"{csv_path} row {row['line']} (image {row['filename']}): skipped because row "
                           f"{bad_images[row['filename']]} of the same image is invalid")
        else:
            kept.append(row)
    return _build_records(kept, images, classes, grouping, skipped, has_gender, has_age)


def _checked_lines(fh, path: Path):
    """Decoded lines of a binary file; a non-UTF-8 line becomes an AnnotationError naming the file and line."""
    for line_no, raw in enumerate(fh, start=1):
        try:
            yield raw.decode("utf-8-sig" if line_no == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise AnnotationError(f"{path} line {line_no}: not UTF-8 text ({err})") from err


def _parse_row(
    fields: list[str], col: dict[str, int], n_header: int, has_gender: bool, has_age: bool,
    class_ids: dict[str, int], classes: str,
) -> dict:
    """Parse one CSV row; ValueError describes what is wrong with it."""
    if len(fields) != n_header:
        raise ValueError(f"has {len(fields)} fields, the header has {n_header}")

    def get(name: str) -> str:
        return fields[col[name]].strip()

    if not get("filename"):
        raise ValueError("empty filename")
    person_id = _as_int(get("person_id"), "person_id")
    class1 = get("class1")
    class1_id = class_ids[class1] if class1 in class_ids else -1  # -1: not a FACET class
    if classes == "class1" and class1_id < 0:
        raise ValueError(f"unknown class1 {class1!r} (not one of the 52 FACET classes)")
    box = parse_bounding_box(get("bounding_box"))
    counts = [_as_int(get(c), c) for c in SKIN_TONE_COLUMNS]
    if any(v < 0 for v in counts):
        raise ValueError(f"negative skin-tone count in {counts}")
    lighting = [_as_int(get(c), c) for c in LIGHTING_COLUMNS]
    row = {
        "person_id": person_id,
        "class1": class1_id,
        "box": box,
        "counts": counts,
        "lighting": _one_hot_id(lighting[:4]) if lighting[4] <= 0 else -1,  # na, or na plus a value: unknown
    }
    if has_gender:
        row["gender"] = _one_hot_id([_as_int(get(c), c) for c in GENDER_COLUMNS])
    if has_age:
        row["age"] = _one_hot_id([_as_int(get(c), c) for c in AGE_COLUMNS])
    return row


def _as_int(text: str, column: str) -> int:
    """Integer cell; accepts "3" and "3.0" (pandas writes ints as floats when a column had NaN)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"column {column} is not a number: {text!r}") from None
    if not math.isfinite(value) or not value.is_integer():
        raise ValueError(f"column {column} is not an integer: {text!r}")
    return int(value)


def _one_hot_id(flags: list[int]) -> int:
    """Index of the single set flag, -1 when none or several are set (not determinable)."""
    on = [i for i, v in enumerate(flags) if v > 0]
    return on[0] if len(on) == 1 else -1


def _index_images(root: Path, image_dirs: Sequence[str]) -> dict[str, Path]:
    """filename -> path over imgs_1..3 (first folder wins)."""
    found = [root / d for d in image_dirs if (root / d).is_dir()]
    if not found:
        raise FileNotFoundError(
            f"none of the image folders {list(image_dirs)} exists under {root}. " + facet_missing_message(root))
    index: dict[str, Path] = {}
    for folder in found:
        with os.scandir(folder) as entries:
            for entry in entries:
                index.setdefault(entry.name, Path(entry.path))
    return index


def _coco_image_sizes(path: Path) -> dict[str, tuple[int, int]]:
    """file_name -> (height, width) from coco_boxes.json when it exists; empty otherwise."""
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return {img["file_name"]: (int(img["height"]), int(img["width"])) for img in data["images"]}
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path} is not a COCO file with images[].file_name/width/height: {err}") from err


def _image_size(
    filename: str, images: dict[str, Path], coco_sizes: dict[str, tuple[int, int]], verify: bool,
    image_dirs: Sequence[str], root: Path,
) -> tuple[int, int] | Exception:
    """(height, width) of an image, or the problem (FileNotFoundError / ValueError) to report for its rows."""
    path = images.get(filename)
    if path is None:
        return FileNotFoundError(f"image file {filename} not found in {', '.join(image_dirs)} under {root}")
    try:
        size = read_image_size(path, verify=verify)
    except (ValueError, FileNotFoundError) as err:
        return err
    if filename in coco_sizes and coco_sizes[filename] != size:
        h, w = coco_sizes[filename]
        return ValueError(f"image {path} is {size[1]}x{size[0]} (w x h) but {FACET_COCO_BOXES} says {w}x{h}")
    return size


def _build_records(
    rows: list[dict], images: dict[str, Path], classes: str, grouping: str, skipped: list[str],
    has_gender: bool, has_age: bool,
) -> DetectionRecords:
    """Collate parsed rows (images in order of first appearance, persons grouped by image)."""
    image_of: dict[str, int] = {}
    for row in rows:
        image_of.setdefault(row["filename"], len(image_of))
    order = sorted(range(len(rows)), key=lambda i: (image_of[rows[i]["filename"]], i))
    rows = [rows[i] for i in order]
    names = list(image_of)
    counts = np.array([r["counts"] for r in rows], dtype=np.int64).reshape(-1, 10)
    mst = mst_from_counts(counts)
    total = counts.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mst_mean = np.where(total > 0, (counts @ np.arange(1, 11)) / np.maximum(total, 1), np.nan)
    sizes = {r["filename"]: r["size"] for r in rows}
    person_meta = {
        "person_id": np.array([r["person_id"] for r in rows], dtype=np.int64),
        "class1": np.array([r["class1"] for r in rows], dtype=np.int64),
        "mst_mean": mst_mean.astype(np.float64),
    }
    if has_gender:
        person_meta["gender"] = np.array([r["gender"] for r in rows], dtype=np.int64)
    if has_age:
        person_meta["age"] = np.array([r["age"] for r in rows], dtype=np.int64)
    records = DetectionRecords(
        image_paths=[images[n] for n in names],
        image_sizes=np.array([sizes[n] for n in names], dtype=np.int64).reshape(-1, 2),
        image_index=np.array([image_of[r["filename"]] for r in rows], dtype=np.int64),
        cls=(np.array([r["class1"] for r in rows], dtype=np.int64) if classes == "class1"
             else np.zeros(len(rows), dtype=np.int64)),
        boxes_xywhn=np.array([r["xywhn"] for r in rows], dtype=np.float32).reshape(-1, 4),
        mst=mst,
        groups=mst_to_group(mst, grouping),
        proxy=np.array([r["lighting"] for r in rows], dtype=np.int64),
        class_names=list(FACET_CLASSES) if classes == "class1" else ["person"],
        skipped=skipped,
        person_meta=person_meta,
    )
    return records.validate()
