"""Any tabular CSV / Parquet file as features, binary labels and sensitive groups (`dataset=csv`,
data/datasets/csv.py; UCI Adult is a preset of it, conf/dataset/adult.yaml).

Preprocessing is fitted on the training rows only: numeric columns standardised with the training mean and
(population) standard deviation, categorical columns one-hot over the training categories (or a listed category
order; a test value outside the training categories gets an all-zero block), missing values imputed with training
statistics when asked. The feature matrix is the numeric columns (file order) followed by the one-hot blocks (file
order), as the Adult loader (data/adult.py) lays them out.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from resfl_lightning.data.errors import TableError
from resfl_lightning.data.partition import stratified_split
from resfl_lightning.data.table_columns import (
    as_text,
    binary_target,
    category_codes,
    config_text,
    first_missing,
    numeric_column,
    require_columns,
    sensitive_values,
    split_features,
    where,
)
from resfl_lightning.data.table_file import TableFormat, read_table

log = logging.getLogger(__name__)
MISSING_MODES = ("error", "drop", "impute")
TEST_SPLIT_STREAM = 17  # own random stream of the train/test split (partition.py uses streams 0..3 of the seed)


@dataclass(frozen=True)
class TableSpec:
    """Which columns play which role, and how the file is read."""

    target: str
    positive: tuple[str, ...]
    sensitive: tuple[str, ...]
    negative: tuple[str, ...] | None = None
    sensitive_bins: dict[str, tuple[float, ...]] = field(default_factory=dict)
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    features: tuple[str, ...] | None = None
    drop: tuple[str, ...] = ()
    categorical: tuple[str, ...] | None = None
    categories: dict[str, tuple[str, ...]] = field(default_factory=dict)
    missing: str = "error"
    use_sensitive_as_feature: bool = False
    partition_column: str | None = None
    fmt: TableFormat = TableFormat()
    merge_groups_below: int = 0  # groups with fewer training rows become one group (0: none merged)


@dataclass
class LoadedTable:
    """Preprocessed split: float32 features, int64 labels and group ids, the partition column of the training rows."""

    X_train: np.ndarray
    y_train: np.ndarray
    s_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    s_test: np.ndarray
    feature_names: list[str]
    group_names: list[str]
    client_labels: np.ndarray | None = None  # str (n_train,) values of the partition column
    dropped_train: int = 0
    dropped_test: int = 0


@dataclass
class _Part:
    """One file's rows (or the held-out part of the training file) while it is being encoded."""

    path: Path
    frame: pd.DataFrame


def _label_columns(spec: TableSpec) -> list[str]:
    return [spec.target, *spec.sensitive] + ([spec.partition_column] if spec.partition_column else [])


def feature_columns(spec: TableSpec, columns: list[str]) -> list[str]:
    """The model's input columns: dataset.features, or every column but the target, the partition column, the
    dropped ones and (unless use_sensitive_as_feature) the sensitive ones, in file order."""
    if spec.features is not None:
        listed = [c for c in spec.features if c in spec.sensitive and not spec.use_sensitive_as_feature]
        if listed:
            raise TableError(f"dataset.features lists the sensitive column {listed[0]!r}; set "
                             "dataset.use_sensitive_as_feature=true to give it to the model")
        return list(spec.features)
    skip = {spec.target, *spec.drop, *([spec.partition_column] if spec.partition_column else [])}
    if not spec.use_sensitive_as_feature:
        skip |= set(spec.sensitive)
    return [c for c in columns if c not in skip]


def _handle_missing(part: _Part, spec: TableSpec, fmt: TableFormat, used: list[str]) -> int:
    """Apply dataset.missing to the used columns; returns the number of dropped rows."""
    if spec.missing == "drop":
        keep = ~part.frame[used].isna().any(axis=1)
        dropped = int((~keep).sum())
        part.frame = part.frame[keep]
        if part.frame.empty:
            raise TableError(f"{part.path}: every row has a missing value (dataset.missing=drop)")
        return dropped
    checked = used if spec.missing == "error" else _label_columns(spec)
    hit = first_missing(part.frame, checked)
    if hit is not None:
        pos, column = hit
        hint = ("set dataset.missing=drop or impute" if spec.missing == "error"
                else "labels, groups and partition values cannot be imputed")
        raise TableError(f"{where(part.path, fmt, part.frame, pos, column)}: missing value ({hint})")
    return 0


def _group_names(parts: list[_Part], train: _Part, spec: TableSpec, fmt: TableFormat) -> tuple[list[str], list]:
    """The groups (value combinations of the sensitive columns seen in training rows, in dataset.groups order or
    sorted) and each part's group-name Series."""
    per_part, orders = [], []
    for part in parts:
        columns = []
        for column in spec.sensitive:
            values = sensitive_values(part.path, fmt, part.frame, column, spec.sensitive_bins.get(column))
            listed = spec.groups.get(column)
            if listed is not None and not values.isin(listed).all():
                pos = int(np.flatnonzero(~values.isin(listed).to_numpy())[0])
                raise TableError(f"{where(part.path, fmt, part.frame, pos, column)}: value {values.iloc[pos]!r} is "
                                 f"not among dataset.groups.{column} ({', '.join(listed)})")
            columns.append(values)
            if part is train:
                orders.append(list(listed) if listed is not None else sorted(values.unique()))
        names = columns[0] if len(columns) == 1 else pd.Series(
            ["|".join(v) for v in zip(*(c.to_numpy() for c in columns), strict=True)], index=part.frame.index)
        per_part.append(names)
    seen = set(per_part[0].unique())
    group_names = [n for n in ("|".join(combo) for combo in itertools.product(*orders)) if n in seen]
    if len(group_names) < 2:
        raise TableError(f"{train.path}: the sensitive column(s) {', '.join(spec.sensitive)} give one group "
                         f"({', '.join(group_names) or 'none'}) in the training rows; fairness needs at least two")
    return merge_rare_groups(group_names, per_part, spec.merge_groups_below, train.path)


def merge_rare_groups(group_names: list[str], per_part: list[pd.Series], below: int, path: Path
                      ) -> tuple[list[str], list[pd.Series]]:
    """Groups with fewer than `below` rows in the first part (the training file, or the one file before its test
    rows are drawn) become one group named by their values joined with '+', in the place of the first of them; it
    takes two rare groups (one alone is left as it is). Before any split, so every split stratifies by the merged
    group."""
    counts = per_part[0].value_counts()
    rare = [n for n in group_names if counts.get(n, 0) < below]
    if len(rare) < 2:
        if rare:
            log.warning("%s: only group %r has fewer than %d training rows (dataset.merge_groups_below): nothing to "
                        "merge it with, kept as it is", path, rare[0], below)
        return group_names, per_part
    merged = "+".join(rare)
    names = [merged if n == rare[0] else n for n in group_names if n not in rare[1:]]
    if len(names) < 2:
        raise TableError(f"{path}: dataset.merge_groups_below={below} merges every group ({', '.join(rare)}) into "
                         "one; fairness needs at least two")
    size = int(sum(counts.get(n, 0) for n in rare))
    log.info("%s: groups with fewer than %d training rows merged into %r (%d rows)", path, below, merged, size)
    if size < below:
        log.warning("%s: the merged group %r still has only %d training rows (dataset.merge_groups_below=%d)",
                    path, merged, size, below)
    return names, [p.where(~p.isin(rare), merged) for p in per_part]


def _group_ids(part: _Part, names: pd.Series, group_names: list[str], fmt: TableFormat, spec: TableSpec
               ) -> np.ndarray:
    codes = pd.Categorical(names, categories=group_names).codes.astype(np.int64)
    if (codes < 0).any():
        pos = int(np.flatnonzero(codes < 0)[0])
        raise TableError(f"{where(part.path, fmt, part.frame, pos, spec.sensitive[0])}: group {names.iloc[pos]!r} "
                         "does not occur in the training rows, so the model cannot be measured on it")
    return codes


def _encode(parts: list[_Part], train: _Part, spec: TableSpec, fmt: TableFormat, features: list[str]
            ) -> tuple[list[np.ndarray], list[str]]:
    """float32 feature matrices of every part (fitted on `train`), and the feature names."""
    # A column with listed categories is categorical; the list may name columns that are not features (a preset).
    categorical = None if spec.categorical is None else list(spec.categorical) + list(spec.categories)
    numeric, cats = split_features(train.frame, [c for c in features if c not in spec.categories], categorical)
    cats = [c for c in features if c in cats or c in spec.categories]
    numbers = {id(p): np.stack([numeric_column(p.path, fmt, p.frame, c) for c in numeric], axis=1)
               if numeric else np.empty((len(p.frame), 0)) for p in parts}
    if spec.missing == "impute" and numeric:
        fill = np.nanmean(numbers[id(train)], axis=0)
        for block in numbers.values():
            rows, cols = np.nonzero(np.isnan(block))
            block[rows, cols] = fill[cols]
    blocks: dict[int, list[np.ndarray]] = {id(p): [numbers[id(p)]] for p in parts}
    names = list(numeric)
    for column in cats:
        text_train = as_text(train.frame[column])
        fill_value = text_train[train.frame[column].notna()].mode().iloc[0] if spec.missing == "impute" else None
        listed = spec.categories.get(column)
        categories = config_text(listed) if listed is not None else sorted(text_train[train.frame[column].notna()]
                                                                           .unique())
        for p in parts:
            frame = p.frame if fill_value is None else p.frame.assign(**{column: p.frame[column].fillna(fill_value)})
            codes = category_codes(p.path, fmt, frame, column, categories, strict=listed is not None)
            unseen = int((codes < 0).sum())
            if unseen:
                log.info("%s column %s: %d rows hold a category absent from the training rows (all-zero one-hot)",
                         p.path, column, unseen)
            block = np.zeros((len(codes), len(categories)), dtype=np.float64)
            known = np.flatnonzero(codes >= 0)
            block[known, codes[known]] = 1.0
            blocks[id(p)].append(block)
        names += [f"{column}={v}" for v in categories]
    matrices = {key: np.concatenate(b, axis=1) for key, b in blocks.items()}
    k = len(numeric)
    # mean / std over the numeric columns of the whole matrix, as data/adult.py computes them (same float layout)
    mean = matrices[id(train)][:, :k].mean(axis=0)
    std = matrices[id(train)][:, :k].std(axis=0)
    std[std == 0] = 1.0
    for x in matrices.values():
        x[:, :k] = (x[:, :k] - mean) / std
    return [matrices[id(p)].astype(np.float32) for p in parts], names


def load_table(train_path: Path, test_path: Path | None, spec: TableSpec, test_fraction: float = 0.0,
               seed: int = 0) -> LoadedTable:
    """Read, check and preprocess a table; without a test file, test_fraction of the rows (stratified by group,
    drawn from `seed`) form the test split. TableError / FileNotFoundError name the file, line and column."""
    if spec.missing not in MISSING_MODES:
        raise ValueError(f"missing must be one of {', '.join(MISSING_MODES)}, got {spec.missing!r}")
    fmt = spec.fmt
    train = _Part(Path(train_path), read_table(Path(train_path), fmt))
    parts = [train] + ([_Part(Path(test_path), read_table(Path(test_path), fmt))] if test_path is not None else [])
    features = feature_columns(spec, [str(c) for c in train.frame.columns])
    declared = [(c, "categorical") for c in spec.categorical or ()] + [(c, "drop") for c in spec.drop] + \
        [(c, "categories") for c in spec.categories]
    for column, key in declared:
        require_columns(train.path, train.frame, [column], key)
    used = list(dict.fromkeys(_label_columns(spec) + features))
    for part in parts:
        for column, key in [(spec.target, "target")] + [(c, "sensitive") for c in spec.sensitive] + \
                [(spec.partition_column, "partition_column")] * bool(spec.partition_column) + \
                [(c, "features") for c in features]:
            if part is train or key != "partition_column":
                require_columns(part.path, part.frame, [column], key)
    dropped = [_handle_missing(p, spec, fmt, used if p is train else [c for c in used
                                                                      if c != spec.partition_column])
               for p in parts]
    group_names, names = _group_names(parts, train, spec, fmt)
    groups = [_group_ids(p, n, group_names, fmt, spec) for p, n in zip(parts, names, strict=True)]
    labels = [binary_target(p.path, fmt, p.frame, spec.target, config_text(spec.positive),
                            None if spec.negative is None else config_text(spec.negative)) for p in parts]
    if not labels[0].any():
        raise TableError(f"{train.path} column {spec.target!r}: no training row has a positive value "
                         f"({', '.join(config_text(spec.positive))})")
    if test_path is None:
        rest, held = stratified_split(np.arange(len(train.frame)), groups[0], test_fraction,
                                      np.random.default_rng([seed, TEST_SPLIT_STREAM]))
        if len(held) == 0:
            raise TableError(f"{train.path}: no test file and dataset.test_fraction={test_fraction} holds out no "
                             "row; give test_path or a test_fraction > 0")
        test = _Part(train.path, train.frame.iloc[held])
        train = _Part(train.path, train.frame.iloc[rest])
        parts = [train, test]
        groups, labels = [groups[0][rest], groups[0][held]], [labels[0][rest], labels[0][held]]
    (x_train, x_test), feature_names = _encode(parts, train, spec, fmt, features)
    client_labels = as_text(train.frame[spec.partition_column]).to_numpy() if spec.partition_column else None
    if any(dropped):
        log.info("%s: dropped %s rows with missing values", ", ".join(str(p.path) for p in parts[:len(dropped)]),
                 " and ".join(map(str, dropped)))
    return LoadedTable(X_train=x_train, y_train=labels[0], s_train=groups[0], X_test=x_test, y_test=labels[1],
                       s_test=groups[1], feature_names=feature_names, group_names=group_names,
                       client_labels=client_labels, dropped_train=dropped[0],
                       dropped_test=dropped[1] if len(dropped) > 1 else 0)
