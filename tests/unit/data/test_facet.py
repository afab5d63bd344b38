"""FACET reader on a synthetic fixture in FACET's own layout (no FACET data is used or needed)."""

from __future__ import annotations

import csv
import io
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from resfl_lightning.data.facet import (
    FACET_CLASSES,
    FACET_CSV_COLUMNS,
    FACET_DOWNLOAD_URL,
    FACET_LICENCE_NOTICE,
    facet_missing_message,
    load_facet,
    mst_from_counts,
    parse_bounding_box,
)

# The synthetic example row of facet-format.md, verbatim (made-up values, not FACET data).
DOC_HEADER = (
    "person_id,filename,class1,class2,bounding_box,gender_presentation_masc,gender_presentation_fem,"
    "gender_presentation_non_binary,gender_presentation_na,skin_tone_1,skin_tone_2,skin_tone_3,skin_tone_4,"
    "skin_tone_5,skin_tone_6,skin_tone_7,skin_tone_8,skin_tone_9,skin_tone_10,skin_tone_na,age_presentation_young,"
    "age_presentation_middle,age_presentation_older,age_presentation_na,hair_color_black,hair_color_blonde,"
    "hair_color_brown,hair_color_red,hair_color_colored,hair_color_grey,hair_color_na,hairtype_wavy,hairtype_curly,"
    "hairtype_straight,hairtype_coily,hairtype_dreadlocks,hairtype_bald,hairtype_na,has_facial_hair,has_tattoo,"
    "has_cap,has_mask,has_headscarf,has_eyeware,visible_torso,visible_face,visible_minimal,lighting_well_lit,"
    "lighting_dimly_lit,lighting_underexposed,lighting_overexposed,lighting_na"
)
DOC_ROW = (
    '1,sa_1000001.jpg,guitarist,singer,"{""x"": 412.0, ""y"": 180.5, ""width"": 530.0, ""height"": 1210.0}",'
    "1,0,0,0,0,0,1,2,3,1,0,0,0,0,0,0,1,0,0,0,0,1,0,0,0,0,1,0,0,0,0,0,0,1,1,0,0,0,0,1,1,0,0,0,1,0,0"
)

# name -> (folder, width, height)
IMAGES = {
    "sa_1000001.jpg": ("imgs_3", 1000, 1500),
    "sa_1.jpg": ("imgs_1", 200, 100),
    "sa_2.jpg": ("imgs_2", 160, 120),
    "sa_3.jpg": ("imgs_1", 64, 48),
}


def _skin(**counts: int) -> dict[str, int]:
    return {f"skin_tone_{k[1:]}": v for k, v in counts.items()}


def _box(x: float, y: float, w: float, h: float) -> str:
    return json.dumps({"x": x, "y": y, "width": w, "height": h})


# Rows after the documented one (CSV rows 3..7); unspecified columns are 0.
ROWS = [
    {"person_id": 2, "filename": "sa_1.jpg", "class1": "lawman", "bounding_box": _box(20, 10, 40, 60),
     **_skin(k4=1, k5=1), "lighting_well_lit": 1, "gender_presentation_fem": 1, "age_presentation_young": 1},
    # partly outside by 2 px (tolerance 0.02*200+1 = 5 px): clipped to x in [190, 200]
    {"person_id": 3, "filename": "sa_1.jpg", "class1": "doctor", "bounding_box": _box(190, 50, 12, 50),
     **_skin(k2=1, k3=1), "lighting_dimly_lit": 1, "gender_presentation_na": 1, "age_presentation_na": 1},
    # skin tone "cannot be determined" only; Python dict literal instead of JSON
    {"person_id": 4, "filename": "sa_2.jpg", "class1": "waiter", "class2": "",
     "bounding_box": "{'x': 0, 'y': 0, 'width': 160, 'height': 120}", "skin_tone_na": 3, "lighting_na": 1},
    {"person_id": 5, "filename": "sa_3.jpg", "class1": "astronaut", "bounding_box": _box(8, 4.5, 16, 24),
     **_skin(k7=2, k8=2), "lighting_overexposed": 1},
    {"person_id": 6, "filename": "sa_3.jpg", "class1": "waiter", "bounding_box": _box(30, 20, 10, 10),
     **_skin(k9=1, k10=3), "lighting_well_lit": 1, "lighting_dimly_lit": 1},  # two lighting flags: ambiguous
]


def write_facet(root: Path, rows: list[dict] = ROWS, columns: tuple[str, ...] = FACET_CSV_COLUMNS,
                images: dict = IMAGES, raw_lines: list[str] = ()) -> Path:
    """Write annotations/annotations.csv (documented header + example row + `rows`) and JPEGs under imgs_*."""
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, (folder, w, h) in images.items():
        (root / folder).mkdir(exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / folder / name, quality=70)
    csv_path = root / "annotations" / "annotations.csv"
    with open(csv_path, "w", newline="") as fh:
        doc = next(csv.DictReader([DOC_HEADER, DOC_ROW]))
        writer = csv.DictWriter(fh, fieldnames=list(columns), restval=0, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerow(doc)
        for row in rows:
            writer.writerow(row)
        for line in raw_lines:
            fh.write(line + "\n")
    return root


@pytest.fixture()
def facet_root(tmp_path: Path) -> Path:
    return write_facet(tmp_path / "facet")


def test_documented_header_is_the_column_list():
    assert tuple(DOC_HEADER.split(",")) == FACET_CSV_COLUMNS
    assert len(FACET_CSV_COLUMNS) == 52 and len(set(FACET_CSV_COLUMNS)) == 52
    assert len(FACET_CLASSES) == 52 and list(FACET_CLASSES) == sorted(FACET_CLASSES)


def test_parses_images_boxes_and_labels(facet_root: Path):
    rec = load_facet(facet_root)
    assert [p.name for p in rec.image_paths] == ["sa_1000001.jpg", "sa_1.jpg", "sa_2.jpg", "sa_3.jpg"]
    assert [p.parent.name for p in rec.image_paths] == ["imgs_3", "imgs_1", "imgs_2", "imgs_1"]
    np.testing.assert_array_equal(rec.image_sizes, [[1500, 1000], [100, 200], [120, 160], [48, 64]])
    np.testing.assert_array_equal(rec.image_index, [0, 1, 1, 2, 3, 3])
    np.testing.assert_array_equal(rec.person_meta["person_id"], [1, 2, 3, 4, 5, 6])
    expected = np.array([
        [(412 + 265) / 1000, (180.5 + 605) / 1500, 530 / 1000, 1210 / 1500],
        [40 / 200, 40 / 100, 40 / 200, 60 / 100],
        [195 / 200, 75 / 100, 10 / 200, 50 / 100],  # clipped at the right border
        [0.5, 0.5, 1.0, 1.0],
        [16 / 64, 16.5 / 48, 16 / 64, 24 / 48],
        [35 / 64, 25 / 48, 10 / 64, 10 / 48],
    ])
    np.testing.assert_allclose(rec.boxes_xywhn, expected, rtol=0, atol=1e-6)
    # MST: doc row picks 3 4 4 5 5 5 6 -> 32/7 = 4.57 -> 5; 4.5 -> 5; 2.5 -> 3; NA -> 0; 7.5 -> 8; 39/4 = 9.75 -> 10
    np.testing.assert_array_equal(rec.mst, [5, 5, 3, 0, 8, 10])
    np.testing.assert_array_equal(rec.groups, [4, 4, 2, -1, 7, 9])
    np.testing.assert_array_equal(rec.proxy, [2, 0, 1, -1, 3, -1])
    np.testing.assert_array_equal(rec.person_meta["gender"], [0, 1, -1, -1, -1, -1])
    np.testing.assert_array_equal(rec.person_meta["age"], [1, 0, -1, -1, -1, -1])
    np.testing.assert_allclose(rec.person_meta["mst_mean"], [32 / 7, 4.5, 2.5, np.nan, 7.5, 9.75])
    assert rec.class_names == ["person"] and (rec.cls == 0).all()
    assert rec.skipped == []
    # pixel boxes round-trip to the annotations (doc row)
    np.testing.assert_allclose(rec.boxes_xyxy()[0], [412, 180.5, 942, 1390.5], atol=1e-3)


def test_mst3_grouping(facet_root: Path):
    rec = load_facet(facet_root, grouping="mst3")
    np.testing.assert_array_equal(rec.groups, [1, 1, 0, -1, 2, 2])


def test_class1_option(facet_root: Path):
    rec = load_facet(facet_root, classes="class1")
    assert rec.class_names == sorted(rec.class_names) and len(rec.class_names) == 52
    names = [rec.class_names[c] for c in rec.cls]
    assert names == ["guitarist", "lawman", "doctor", "waiter", "astronaut", "waiter"]
    np.testing.assert_array_equal(rec.person_meta["class1"], rec.cls)


def test_mst_from_counts_matches_exact_half_up_rounding():
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 4, size=(500, 10)) * (rng.random((500, 10)) < 0.3)
    counts[:20] = 0  # no choice -> unknown
    ref = []
    for row in counts:
        total = int(row.sum())
        mean = Fraction(int(row @ np.arange(1, 11)), total) if total else None
        ref.append(0 if mean is None else int(mean + Fraction(1, 2)))  # floor(mean + 1/2) = half up
    np.testing.assert_array_equal(mst_from_counts(counts), ref)
    ties = np.zeros((3, 10), dtype=int)
    ties[0, [3, 4]] = 1  # 4.5
    ties[1, [0, 1]] = 1  # 1.5
    ties[2, [1, 2]] = 5  # 2.5
    np.testing.assert_array_equal(mst_from_counts(ties), [5, 2, 3])


def test_parse_bounding_box_forms():
    assert parse_bounding_box('{"x": 1, "y": 2.5, "width": 3, "height": 4}') == (1.0, 2.5, 3.0, 4.0)
    assert parse_bounding_box("{'x': 1, 'y': 2, 'width': 3, 'height': 4}") == (1.0, 2.0, 3.0, 4.0)
    for bad in ("{x: 1", "[1, 2, 3, 4]", '{"x": 1, "y": 2, "width": 3}', '{"x": 1, "y": 2, "width": 0, "height": 4}'):
        with pytest.raises(ValueError, match="bounding_box"):
            parse_bounding_box(bad)


def test_missing_root_explains_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("FACET_ROOT", raising=False)
    with pytest.raises(FileNotFoundError) as err:
        load_facet(tmp_path / "nowhere")
    msg = str(err.value)
    assert str(tmp_path / "nowhere") in msg and FACET_DOWNLOAD_URL in msg and "annotations/annotations.csv" in msg
    with pytest.raises(FileNotFoundError, match="FACET_ROOT"):
        load_facet()
    assert "research" in FACET_LICENCE_NOTICE and "redistribut" in FACET_LICENCE_NOTICE
    assert FACET_LICENCE_NOTICE in facet_missing_message(tmp_path)


def test_env_var_fallback(facet_root: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FACET_ROOT", str(facet_root))
    assert load_facet().num_persons == 6


def test_missing_columns_name_file_and_header(tmp_path: Path):
    cols = tuple(c for c in FACET_CSV_COLUMNS if c not in ("skin_tone_3", "bounding_box"))
    root = write_facet(tmp_path / "f", columns=cols)
    for mode in ("raise", "skip"):  # a missing column cannot be skipped row by row
        with pytest.raises(ValueError, match=r"annotations\.csv row 1 \(header\).*bounding_box.*skin_tone_3"):
            load_facet(root, on_error=mode)


def _bad(filename: str, **overrides) -> dict:
    return {"person_id": 99, "filename": filename, "class1": "runner", "bounding_box": _box(1, 1, 5, 5),
            **_skin(k5=3), "lighting_well_lit": 1, **overrides}


BAD_CASES = {
    "unparsable box": (_bad("sa_2.jpg", bounding_box="{'x': 1, 'y'"), ValueError, "unparsable bounding_box"),
    "box outside": (_bad("sa_2.jpg", bounding_box=_box(150, 10, 40, 20)), ValueError, "outside"),
    "missing image": (_bad("sa_404.jpg"), FileNotFoundError, "not found in imgs_1, imgs_2, imgs_3"),
    "corrupt image": (_bad("sa_corrupt.jpg"), ValueError, "corrupt or unreadable image"),
    "bad count": (_bad("sa_2.jpg", skin_tone_4="x"), ValueError, "skin_tone_4 is not a number"),
    "duplicate id": (_bad("sa_2.jpg", person_id=3), ValueError, "duplicate person_id 3"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_rows_raise_naming_file_and_row(tmp_path: Path, case: str):
    row, exc, text = BAD_CASES[case]
    root = write_facet(tmp_path / "f", rows=[*ROWS, row])
    (root / "imgs_2" / "sa_corrupt.jpg").write_bytes(b"not a jpeg" * 20)
    with pytest.raises(exc) as err:
        load_facet(root)
    msg = str(err.value)
    assert "annotations.csv row 8" in msg and row["filename"] in msg and text in msg


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_skip_mode_drops_bad_rows_and_their_images(tmp_path: Path, case: str):
    row, _, text = BAD_CASES[case]
    root = write_facet(tmp_path / "f", rows=[*ROWS, row])
    (root / "imgs_2" / "sa_corrupt.jpg").write_bytes(b"not a jpeg" * 20)
    rec = load_facet(root, on_error="skip")
    assert "annotations.csv row 8" in rec.skipped[0] and text in rec.skipped[0]
    if row["filename"] == "sa_2.jpg":  # the good person of sa_2.jpg (row 5) goes too: no unlabelled persons
        assert rec.num_skipped == 2 and "row 5" in rec.skipped[1] and "row 8" in rec.skipped[1]
        assert "sa_2.jpg" not in [p.name for p in rec.image_paths]
        np.testing.assert_array_equal(rec.person_meta["person_id"], [1, 2, 3, 5, 6])
    else:
        assert rec.num_skipped == 1
        np.testing.assert_array_equal(rec.person_meta["person_id"], [1, 2, 3, 4, 5, 6])
    rec.validate()


def test_wrong_field_count_and_truncated_image(tmp_path: Path):
    good = next(csv.reader([DOC_ROW]))
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(["7", "sa_2.jpg", *good[2:-2]])  # the doc row minus 2 fields
    short = buf.getvalue()
    root = write_facet(tmp_path / "f", raw_lines=[short])
    with pytest.raises(ValueError, match=r"row 8 \(image sa_2\.jpg\): has 50 fields, the header has 52"):
        load_facet(root)
    root = write_facet(tmp_path / "g")
    path = root / "imgs_1" / "sa_1.jpg"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert load_facet(root).num_persons == 6  # header-only read does not see the truncation
    with pytest.raises(ValueError, match=r"row 3 \(image sa_1\.jpg\): corrupt or unreadable image"):
        load_facet(root, verify_images=True)
    rec = load_facet(root, verify_images=True, on_error="skip")
    assert rec.num_skipped == 2 and rec.num_persons == 4


def test_coco_boxes_sizes_are_cross_checked(facet_root: Path):
    coco = {"images": [{"id": i, "file_name": n, "width": w, "height": h} for i, (n, (_, w, h)) in
                       enumerate(IMAGES.items())], "annotations": [], "categories": []}
    path = facet_root / "annotations" / "coco_boxes.json"
    path.write_text(json.dumps(coco))
    assert load_facet(facet_root).num_persons == 6
    coco["images"][2]["width"] = 120  # sa_2.jpg
    path.write_text(json.dumps(coco))
    with pytest.raises(ValueError, match=r"row 5 \(image sa_2\.jpg\).*coco_boxes\.json says 120x120"):
        load_facet(facet_root)


def test_subset_keeps_persons_with_their_images(facet_root: Path):
    rec = load_facet(facet_root)
    sub = rec.subset([3, 1]).validate()
    assert [p.name for p in sub.image_paths] == ["sa_3.jpg", "sa_1.jpg"]
    np.testing.assert_array_equal(sub.image_index, [0, 0, 1, 1])
    np.testing.assert_array_equal(sub.person_meta["person_id"], [5, 6, 2, 3])
    np.testing.assert_array_equal(sub.boxes_xywhn, rec.boxes_xywhn[[4, 5, 1, 2]])


def test_non_utf8_csv_names_the_line(tmp_path: Path):
    root = write_facet(tmp_path / "f")
    path = root / "annotations" / "annotations.csv"
    path.write_bytes(path.read_bytes() + b"7,sa_2.jpg,\xff\xfe\n")
    with pytest.raises(ValueError, match=r"annotations\.csv line 8: not UTF-8"):
        load_facet(root, on_error="skip")
