"""Column roles of a user table (target, sensitive groups, numeric and categorical features) and the checks that
stop bad input before training, each naming the file, line and column.

Used by resfl_lightning/data/table_loader.py; every function takes the DataFrame as read (its index is the data row
number, kept through row filtering so errors can name the file line).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from resfl_lightning.data.errors import TableError
from resfl_lightning.data.table_file import TableFormat, file_line

# An object column whose non-missing values are at least this share numbers is a numeric column with bad values,
# not a categorical one (a typo in a numeric column must not turn it into one-hot codes silently).
NUMERIC_SHARE = 0.9


def where(path: Path, fmt: TableFormat, frame: pd.DataFrame, position: int, column: str) -> str:
    """'<file> line L column C' for the row at `position` of `frame` (after filtering)."""
    return f"{path} {file_line(path, fmt, int(frame.index[position]))} column {column!r}"


def require_columns(path: Path, frame: pd.DataFrame, columns: Sequence[str], key: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise TableError(f"{path}: no column {missing[0]!r} (named by dataset.{key}); the file has columns "
                         f"{', '.join(map(str, frame.columns))}")


def as_text(values: pd.Series) -> pd.Series:
    """Values as stripped strings (integral floats as integers, so 1.0 and 1 name the same category)."""
    if pd.api.types.is_float_dtype(values) and np.all(np.mod(values.dropna(), 1) == 0):
        values = values.astype("Int64")
    return values.astype(str).str.strip()


def config_text(values: Sequence[object]) -> list[str]:
    return [str(v).strip() for v in values]


def first_missing(frame: pd.DataFrame, columns: Sequence[str]) -> tuple[int, str] | None:
    """(position, column) of the first missing value in `columns`, or None."""
    na = frame[list(columns)].isna().to_numpy()
    if not na.any():
        return None
    pos = int(np.flatnonzero(na.any(axis=1))[0])
    return pos, str(columns[int(np.flatnonzero(na[pos])[0])])


def numeric_column(path: Path, fmt: TableFormat, frame: pd.DataFrame, column: str) -> np.ndarray:
    """float64 values of a numeric column; TableError at the first value that is not a number."""
    values = frame[column]
    if pd.api.types.is_bool_dtype(values):
        return values.to_numpy(dtype=np.float64)
    if pd.api.types.is_numeric_dtype(values):
        return values.to_numpy(dtype=np.float64)
    parsed = pd.to_numeric(values, errors="coerce")
    bad = np.flatnonzero(parsed.isna().to_numpy() & values.notna().to_numpy())
    if bad.size:
        pos = int(bad[0])
        raise TableError(f"{where(path, fmt, frame, pos, column)}: {values.iloc[pos]!r} is not a number (the "
                         "column is numeric; list it in dataset.categorical if it holds categories)")
    return parsed.to_numpy(dtype=np.float64)


def looks_numeric(values: pd.Series) -> bool:
    """A text column most of whose values parse as numbers (see NUMERIC_SHARE)."""
    present = values.dropna()
    if present.empty:
        return False
    parsed = pd.to_numeric(present, errors="coerce")
    return bool(parsed.notna().mean() >= NUMERIC_SHARE)


def split_features(frame: pd.DataFrame, features: Sequence[str], categorical: Sequence[str] | None
                   ) -> tuple[list[str], list[str]]:
    """(numeric, categorical) feature columns in file order. categorical None: inferred (text / bool / category
    dtypes are categorical, unless the text mostly holds numbers: then numeric, and its bad values are reported)."""
    numeric, cats = [], []
    for column in features:
        if categorical is not None:
            (cats if column in categorical else numeric).append(column)
            continue
        values = frame[column]
        if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
            numeric.append(column)
        elif looks_numeric(values):
            numeric.append(column)
        else:
            cats.append(column)
    return numeric, cats


def category_codes(path: Path, fmt: TableFormat, frame: pd.DataFrame, column: str, categories: Sequence[str],
                   strict: bool) -> np.ndarray:
    """int64 code of each value in `categories`; -1 for an unseen value (strict: TableError naming it)."""
    text = as_text(frame[column])
    codes = pd.Categorical(text, categories=list(categories)).codes.astype(np.int64)
    if strict and (codes < 0).any():
        pos = int(np.flatnonzero(codes < 0)[0])
        raise TableError(f"{where(path, fmt, frame, pos, column)}: unknown category {text.iloc[pos]!r} (the listed "
                         f"categories are {', '.join(categories)})")
    return codes


def binary_target(path: Path, fmt: TableFormat, frame: pd.DataFrame, column: str, positive: Sequence[str],
                  negative: Sequence[str] | None) -> np.ndarray:
    """int64 labels: 1 for a positive value, 0 for a negative one; TableError at an unknown value. Without a
    negative list every non-positive value is negative, but the column may then hold only one such value."""
    text = as_text(frame[column])
    is_pos = text.isin(positive).to_numpy()
    if negative is not None:
        unknown = ~is_pos & ~text.isin(negative).to_numpy()
        if unknown.any():
            pos = int(np.flatnonzero(unknown)[0])
            raise TableError(f"{where(path, fmt, frame, pos, column)}: unknown target value {text.iloc[pos]!r} "
                             f"(dataset.positive: {', '.join(positive)}; dataset.negative: {', '.join(negative)})")
    else:
        others = pd.unique(text[~is_pos])
        if len(others) > 1:
            pos = int(np.flatnonzero((text == others[1]).to_numpy())[0])
            raise TableError(f"{where(path, fmt, frame, pos, column)}: unknown target value {others[1]!r}: the "
                             f"target is binary; besides the positive value(s) {', '.join(positive)} it already "
                             f"holds {others[0]!r}. List every negative value in dataset.negative")
    return is_pos.astype(np.int64)


def bin_labels(edges: Sequence[float]) -> list[str]:
    return [f"[{lo:g}, {hi:g})" for lo, hi in zip(edges[:-1], edges[1:], strict=False)]


def sensitive_values(path: Path, fmt: TableFormat, frame: pd.DataFrame, column: str,
                     bins: Sequence[float] | None) -> pd.Series:
    """The group name of each row for one sensitive column: its value, or its bin '[lo, hi)' of a numeric column."""
    if bins is None:
        return as_text(frame[column])
    values = numeric_column(path, fmt, frame, column)
    edges = np.asarray(bins, dtype=np.float64)
    index = np.searchsorted(edges, values, side="right") - 1
    outside = (index < 0) | (index >= len(edges) - 1)
    if outside.any():
        pos = int(np.flatnonzero(outside)[0])
        raise TableError(f"{where(path, fmt, frame, pos, column)}: {values[pos]:g} lies outside the bins "
                         f"[{edges[0]:g}, {edges[-1]:g}) of dataset.sensitive_bins.{column}")
    return pd.Series(np.asarray(bin_labels(list(edges)), dtype=object)[index], index=frame.index)
