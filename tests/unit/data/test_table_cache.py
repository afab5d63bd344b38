"""data/table_cache.py: a cached table is exactly load_table's, is read back instead of parsing, and any change of
what it depends on (file bytes, spec, drawn test rows, an unreadable file) builds it again."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from resfl_lightning.data import table_cache
from resfl_lightning.data.table_loader import LoadedTable, load_table
from tests.unit.data.test_csv_loader import SPEC, people, write


def assert_same(a: LoadedTable, b: LoadedTable) -> None:
    for field in dataclasses.fields(LoadedTable):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), field.name
        else:
            assert x == y, field.name


@pytest.fixture
def files(tmp_path):
    frame = people(200, 0)
    frame.loc[5, "x"] = np.nan  # a dropped row, counted in the record
    return write(frame, tmp_path / "train.csv"), write(people(60, 1), tmp_path / "test.csv")


def test_a_cached_table_is_read_back_exactly_without_parsing(files, tmp_path, monkeypatch):
    train, test = files
    spec = dataclasses.replace(SPEC, missing="drop", partition_column="region")
    fresh = load_table(train, test, spec)
    assert_same(table_cache.cached_load_table(train, test, spec, root=tmp_path / "cache"), fresh)  # built, stored
    assert len(list((tmp_path / "cache" / "tables").glob("*.npz"))) == 1
    monkeypatch.setattr(table_cache, "load_table", lambda *a, **k: pytest.fail("parsed again"))
    again = table_cache.cached_load_table(train, test, spec, root=tmp_path / "cache")
    assert_same(again, fresh)
    assert again.dropped_train == 1 and again.client_labels.dtype == object  # as load_table gives them


def test_every_input_of_the_result_is_in_the_key(files, tmp_path):
    train, test = files
    key = table_cache.table_key(train, test, SPEC, 0.0, 0)
    assert table_cache.table_key(train, test, SPEC, 0.0, 1) == key  # a test file: the seed draws nothing
    assert table_cache.table_key(train, None, SPEC, 0.2, 0) != table_cache.table_key(train, None, SPEC, 0.2, 1)
    assert table_cache.table_key(train, test, dataclasses.replace(SPEC, missing="drop"), 0.0, 0) != key
    write(people(201, 0), train)  # other bytes
    assert table_cache.table_key(train, test, SPEC, 0.0, 0) != key


def test_an_unreadable_cache_file_is_built_again(files, tmp_path):
    train, test = files
    spec = dataclasses.replace(SPEC, missing="drop")
    root = tmp_path / "cache"
    table_cache.cached_load_table(train, test, spec, root=root)
    (stored,) = (root / "tables").glob("*.npz")
    stored.write_bytes(b"not a zip file")
    assert_same(table_cache.cached_load_table(train, test, spec, root=root), load_table(train, test, spec))
    assert stored.stat().st_size > 100  # rewritten whole
