"""Errors in the user's data files, each naming the file and, where there is one, the line and column. They derive
from InputError, so a command reports them as one line and exits with status 2 (resfl_lightning/cli/input_errors.py);
they stay ValueError / FileNotFoundError for the callers that catch those."""

from __future__ import annotations

from resfl_lightning.config.errors import InputError


class TableError(InputError, ValueError):
    """Bad content of a user table (CSV / Parquet): data/table_file.py, table_columns.py, table_loader.py."""

    kind = "table"


class AnnotationError(InputError, ValueError):
    """Bad annotations: a label file row, a groups file, an annotation CSV or the dataset yaml."""

    kind = "annotation"


class ImageError(InputError, ValueError):
    """An image file that cannot be read, or reads as an empty image."""

    kind = "image"


class MissingDataFile(InputError, FileNotFoundError):
    """A data file (table, groups file, image, label file) that is not there."""

    kind = "missing file"
