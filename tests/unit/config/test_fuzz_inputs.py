"""Bad input, fuzzed: random values for every key the config schema declares and random damage to annotation
files end in a clear error naming the key / file and row, or in a counted skip, never a traceback from a library."""

from __future__ import annotations

import copy
import csv
import io
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from resfl_lightning import builders
from resfl_lightning.config import ConfigError
from resfl_lightning.config.fields import matches
from resfl_lightning.data.adult import read_adult_file
from resfl_lightning.data.carla import _parse_label_line, load_carla
from resfl_lightning.data.facet import load_facet
from resfl_lightning.data.federated import instantiate_dataset
from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True),
                      st.text(max_size=8), st.lists(st.integers(0, 5), max_size=3))
KEY_AT_START = re.compile(r"^[a-z_]+(\.[a-z_0-9]+)*[:/ ]")


def _leaves(node, prefix: str = "") -> list[str]:
    out = []
    for key in node:
        child, path = node[key], f"{prefix}{key}"
        out += _leaves(child, f"{path}.") if OmegaConf.is_dict(child) else [path]
    return out


@pytest.fixture(scope="module")
def base_cfg():
    return compose_config("logger=none")


# Every key the schema declares for the default run, but the opaque nodes other modules check (attack, aggregation).
SCHEMA_KEYS = sorted(k for k in _leaves(load_config(compose_config("logger=none")))
                     if not k.startswith(("attack", "aggregation")))


def _declared_type(typed, key: str):
    """The schema's type of `key` (the field annotation on the section class that holds it)."""
    import typing

    parent, _, leaf = key.rpartition(".")
    section = OmegaConf.get_type(OmegaConf.select(typed, parent) if parent else typed)
    if section is dict:  # an item of a mapping-valued key (dataset.protected_groups.mst3)
        return typing.get_args(_declared_type(typed, parent))[1]
    return typing.get_type_hints(section)[leaf]


@FUZZ
@given(key=st.sampled_from(SCHEMA_KEYS), value=ANY_VALUE)
def test_config_values_give_a_keyed_error_or_valid_settings(base_cfg, key, value):
    cfg = copy.deepcopy(base_cfg)
    OmegaConf.update(cfg, key, value, force_add=True)
    try:
        typed = load_config(cfg)
    except ConfigError as err:
        assert KEY_AT_START.match(str(err)), str(err)
        if not matches(_declared_type(load_config(base_cfg), key), value):  # a wrong type names the key itself
            assert str(err).startswith(f"{key}:"), str(err)
        return
    # accepted: every object the run builds from these keys accepts them too (no late ValueError / TypeError)
    builders.federation_settings(typed)
    builders.ufm_settings(typed)
    builders.optim_settings(typed)
    algorithm = builders.algorithm_of(typed)
    algorithm.loss_weights()
    algorithm.adversary(typed.federation.rounds)
    instantiate_dataset(typed.dataset).loader.kwargs()


# --- YOLO label lines ------------------------------------------------------------------------------------------

NUM = st.one_of(st.floats(-2, 3), st.sampled_from(["nan", "inf", "-inf", "1e400", "x", "", "0x10"]))


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(NUM.map(str), min_size=0, max_size=8), raw=st.text(max_size=40),
       use_raw=st.booleans())
def test_yolo_label_lines_parse_or_name_the_problem(fields, raw, use_raw):
    text = raw if use_raw else " ".join(["0", *fields])
    out = _parse_label_line(text, num_classes=1, width=64, height=48, tolerance=0.02)
    if isinstance(out, str):
        assert out  # a message the reader prefixes with file and line
        return
    cls, xc, yc, w, h, _ = out
    assert cls == 0 and 0 < w <= 1 and 0 < h <= 1
    assert 0 <= xc - w / 2 + 1e-6 and xc + w / 2 <= 1 + 1e-6 and 0 <= yc - h / 2 + 1e-6 and yc + h / 2 <= 1 + 1e-6


# --- damaged CSV rows (FACET, CARLA, Adult) ---------------------------------------------------------------------

DAMAGE = st.sampled_from(["", "nan", "-1", "1e309", "abc", "{", "{'x': 1}", "3.5", "999999", '"', "\x00", "é"])


def _damage_row(line: str, column: int, value: str, truncate: bool) -> str:
    fields = next(csv.reader([line]))
    if truncate:
        fields = fields[: max(1, column)]
    else:
        fields[column % len(fields)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(fields)
    return out.getvalue()


def _assert_names_file_and_row(err: Exception, root: Path) -> None:
    """The message names a file under `root` and a row or line of it (a damaged frame name in one CARLA table is
    reported where the other table refers to it)."""
    assert re.search(re.escape(str(root)) + r"/\S+ (row|line) \d+", str(err)), str(err)


@pytest.fixture(scope="module")
def facet_root(tmp_path_factory):
    from tests.unit.data.test_facet import write_facet

    return write_facet(tmp_path_factory.mktemp("fuzz") / "facet")


@FUZZ
@given(row=st.integers(1, 5), column=st.integers(0, 60), value=DAMAGE, truncate=st.booleans())
def test_facet_rows_raise_naming_file_and_row_or_are_counted_as_skipped(facet_root, row, column, value, truncate):
    path = facet_root / "annotations" / "annotations.csv"
    original = path.read_text()
    lines = original.splitlines()
    lines[row] = _damage_row(lines[row], column, value, truncate)
    try:
        path.write_text("\n".join(lines) + "\n")
        try:
            records = load_facet(facet_root, on_error="raise")
            records.validate()
        except (ValueError, FileNotFoundError) as err:
            _assert_names_file_and_row(err, facet_root)
        skipped = load_facet(facet_root, on_error="skip")
        skipped.validate()
        data_rows = sum(1 for line in lines[1:] if line.strip())
        assert skipped.num_persons + skipped.num_skipped == data_rows
    finally:
        path.write_text(original)


@pytest.fixture(scope="module")
def carla_root(tmp_path_factory):
    from tests.unit.data.test_carla import write_carla

    return write_carla(tmp_path_factory.mktemp("fuzz") / "carla")


CARLA_FILES = ["metadata.csv", "pedestrians.csv", "labels/finetune/f0001.txt", "labels/eval/e0002.txt"]


@FUZZ
@given(which=st.sampled_from(CARLA_FILES), row=st.integers(1, 3), column=st.integers(0, 6), value=DAMAGE,
       truncate=st.booleans())
# found by hypothesis: a ped_index past the frame's boxes named pedestrians.csv without its folder
@example(which="pedestrians.csv", row=1, column=1, value="999999", truncate=False)
def test_carla_files_raise_naming_file_and_row_or_skip_the_frame(carla_root, which, row, column, value, truncate):
    path = carla_root / which
    original = path.read_bytes()
    lines = original.decode().splitlines() or [""]
    row = min(row, len(lines) - 1) if which.endswith(".csv") else min(row - 1, len(lines) - 1)
    if which.endswith(".csv"):
        lines[row] = _damage_row(lines[row], column, value, truncate)
    else:  # a YOLO label line: space separated
        parts = lines[row].split() or ["0"]
        parts = parts[: max(1, column)] if truncate else [*parts[:column % len(parts)], value,
                                                          *parts[column % len(parts) + 1:]]
        lines[row] = " ".join(parts)
    try:
        path.write_bytes(("\n".join(lines) + "\n").encode("utf-8", errors="surrogateescape"))
        try:
            load_carla(carla_root, on_error="raise").validate()
        except (ValueError, FileNotFoundError) as err:
            _assert_names_file_and_row(err, carla_root)
        records = load_carla(carla_root, on_error="skip")
        records.validate()
    finally:
        path.write_bytes(original)


ADULT_LINE = ("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, "
              "40, United-States, <=50K")


@FUZZ
@given(column=st.integers(0, 14), value=DAMAGE, truncate=st.booleans(), row=st.integers(0, 2))
def test_adult_rows_raise_naming_file_and_line(tmp_path, column, value, truncate, row):
    lines = [ADULT_LINE] * 3
    fields = [f.strip() for f in ADULT_LINE.split(",")]
    fields = fields[:max(1, column)] if truncate else [*fields[:column], value, *fields[column + 1:]]
    lines[row] = ", ".join(fields)
    path = tmp_path / "adult.data"
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    try:
        rows, dropped = read_adult_file(path)
    except ValueError as err:
        assert str(path) in str(err)
        if "not the ASCII" not in str(err):
            assert f"line {row + 1}" in str(err), str(err)
        return
    assert len(rows) + dropped == 3 and all(len(r) == 15 for r in rows)
