"""Reading one user table (CSV, or Parquet when pyarrow is importable) into a pandas DataFrame, and naming the file
line of a data row in error messages.

pandas skips blank and comment lines and the header, so a DataFrame row is not a file line; `file_line` finds the
line again with the csv module (only when an error is reported, so the fast path reads the file once).
"""

from __future__ import annotations

import csv
import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from resfl_lightning.data.errors import MissingDataFile, TableError

PARQUET_SUFFIXES = (".parquet", ".pq")


@dataclass(frozen=True)
class TableFormat:
    """How a CSV file is laid out: header row or given column names, separator, comment character, missing
    markers."""

    header: bool = True
    columns: tuple[str, ...] = ()
    sep: str = ","
    comment: str | None = None
    na_values: tuple[str, ...] = ()


def is_parquet(path: Path) -> bool:
    return path.suffix.lower() in PARQUET_SUFFIXES


def read_table(path: Path, fmt: TableFormat) -> pd.DataFrame:
    """The file as a DataFrame (types inferred, surrounding spaces of fields stripped); TableError names the file."""
    if not path.is_file():
        raise MissingDataFile(f"{path}: no such file")
    if is_parquet(path):
        return _read_parquet(path, fmt)
    try:
        with warnings.catch_warnings():
            # index_col=False: never turn surplus leading fields into an index; pandas warns instead, an error here
            warnings.simplefilter("error", pd.errors.ParserWarning)
            frame = pd.read_csv(path, sep=fmt.sep, header=0 if fmt.header else None,
                                names=list(fmt.columns) if fmt.columns else None, comment=fmt.comment,
                                na_values=list(fmt.na_values), skipinitialspace=True, on_bad_lines="error",
                                low_memory=False, index_col=False)
    except pd.errors.ParserWarning:
        width = len(fmt.columns) if fmt.columns else len(next(_header_fields(path, fmt), []))
        line_no = next((n for n, fields in _data_lines(path, fmt) if len(fields) > width), "?")
        raise TableError(f"{path} line {line_no}: more fields than the {width} column names") from None
    except pd.errors.EmptyDataError as err:
        raise TableError(f"{path}: the file is empty ({err})") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise TableError(f"{path}: cannot parse as CSV (sep={fmt.sep!r}): {err}") from None
    if fmt.header:
        duplicated = [c for c in frame.columns if str(c).rpartition(".")[0] in frame.columns]
        if duplicated:  # pandas renames a repeated header "x" to "x.1"
            raise TableError(f"{path} line 1: column {str(duplicated[0]).rpartition('.')[0]!r} appears twice")
    frame.columns = [str(c).strip() for c in frame.columns]
    if frame.empty:
        raise TableError(f"{path}: no data rows")
    _check_short_rows(path, fmt, frame)
    return frame


def _read_parquet(path: Path, fmt: TableFormat) -> pd.DataFrame:
    if importlib.util.find_spec("pyarrow") is None:
        raise TableError(f"{path}: reading Parquet needs pyarrow, which is not installed (pip install pyarrow), "
                         "or convert the file to CSV")
    frame = pd.read_parquet(path)
    if fmt.na_values:
        frame = frame.replace(list(fmt.na_values), float("nan"))
    return frame


def _check_short_rows(path: Path, fmt: TableFormat, frame: pd.DataFrame) -> None:
    """pandas fills the missing trailing fields of a short row with NaN; report such a row instead. Looked for only
    when the last column has a missing value, which every short row makes."""
    if not frame.iloc[:, -1].isna().any():
        return
    width = frame.shape[1]
    for line_no, fields in _data_lines(path, fmt):
        if len(fields) < width:
            raise TableError(f"{path} line {line_no}: expected {width} fields separated by {fmt.sep!r}, "
                             f"got {len(fields)}")


def _data_lines(path: Path, fmt: TableFormat):
    """(line number, fields) of each data row, skipping the header, blank lines and comment lines as pandas does."""
    with open(path, newline="", encoding="utf-8", errors="replace") as fh:
        reader = csv.reader(fh, delimiter=fmt.sep, skipinitialspace=True)
        header_left = fmt.header
        for fields in reader:
            if not fields or all(not f.strip() for f in fields):
                continue
            if fmt.comment and fields[0].lstrip().startswith(fmt.comment):
                continue
            if header_left:
                header_left = False
                continue
            yield reader.line_num, fields


def _header_fields(path: Path, fmt: TableFormat):
    """The header row's fields (the first non-blank, non-comment line)."""
    header_fmt = TableFormat(header=False, sep=fmt.sep, comment=fmt.comment)
    for _, fields in _data_lines(path, header_fmt):
        yield fields
        return


def file_line(path: Path, fmt: TableFormat, row: int) -> str:
    """'line L' of the row-th data row of a CSV file ('row R' of a Parquet file), for error messages."""
    if is_parquet(path):
        return f"row {row + 1}"
    for k, (line_no, _) in enumerate(_data_lines(path, fmt)):
        if k == row:
            return f"line {line_no}"
    return f"data row {row + 1}"
