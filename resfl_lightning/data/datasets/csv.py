"""`dataset=csv`: any tabular CSV (or Parquet) file with a binary target and sensitive column(s) (read and
preprocessed by data/table_loader.py). Clients share the training rows (iid, dirichlet, or one client per value of
partition_column); the test split is the test file, or test_fraction of the rows; the attack reserve is carved from
the training rows."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.fields import setting
from resfl_lightning.data.datasets.base import FederatedDataset
from resfl_lightning.data.table_file import TableFormat
from resfl_lightning.data.table_loader import MISSING_MODES, TableSpec

log = logging.getLogger(__name__)


def one_source(ds: CsvDataset) -> None:
    if ds.path and (ds.train_path or ds.test_path):
        raise ConfigError("dataset.path: give either path (one file, split by test_fraction) or train_path + "
                          "test_path, not both")
    if ds.test_path and not ds.train_path:
        raise ConfigError("dataset.train_path: test_path is set but train_path is not")


def test_split_has_one_source(ds: CsvDataset) -> None:
    if ds.test_path and ds.test_fraction != 0.0:
        raise ConfigError(f"dataset.test_fraction: the test split is dataset.test_path, so the training file is not "
                          f"split for testing; set it to 0 (got {ds.test_fraction})")


def bins_are_increasing(ds: CsvDataset) -> None:
    for column, edges in ds.sensitive_bins.items():
        if column not in ds.sensitive_columns:
            raise ConfigError(f"dataset.sensitive_bins.{column}: not a sensitive column "
                              f"({', '.join(ds.sensitive_columns)})")
        if len(edges) < 3 or any(b <= a for a, b in zip(edges[:-1], edges[1:], strict=False)):
            raise ConfigError(f"dataset.sensitive_bins.{column}: needs at least 3 increasing edges (two bins), "
                              f"got {list(edges)}")


@dataclass(kw_only=True)
class CsvDataset(FederatedDataset):
    checks = (one_source, test_split_has_one_source, bins_are_increasing)
    supports_column_partition = True

    task: str = setting("classification", "binary classification of the target column", choices=("classification",))
    root: str | None = setting(None, "folder the relative paths below are read from (null: the working directory)")
    path: str | None = setting(None, "one CSV / Parquet file; test_fraction of its rows form the test split")
    train_path: str | None = setting(None, "training file (with test_path: no split of it for testing)")
    test_path: str | None = setting(None, "test file, preprocessed with the training file's statistics")
    target: str | None = setting(None, "the label column")
    positive: list[str | int] = setting([], "the target value(s) meaning the positive class")
    negative: list[str | int] | None = setting(None, "the negative value(s); null: the one other value")
    sensitive: str | None = setting(None, "sensitive column, or several comma-separated (race,sex: one group per "
                                    "value combination)")
    sensitive_bins: dict[str, list[float]] = setting({}, "per numeric sensitive column, bin edges [lo, ..., hi)")
    groups: dict[str, list[str | int]] = setting({}, "per sensitive column, its values in group-id order "
                                                 "(default: sorted)")
    merge_groups_below: int = setting(0, "groups with fewer training rows than this become one group, named by "
                                      "their values joined with '+' (0: none merged)", ge=0)
    features: list[str] | None = setting(None, "input columns (null: every other column)")
    drop: list[str] = setting([], "columns never used")
    categorical: list[str] | None = setting(None, "categorical feature columns (null: inferred from the values)")
    categories: dict[str, list[str | int]] = setting({}, "per categorical column, its categories in one-hot order "
                                                     "(a value outside them is an error)")
    missing: str = setting("error", "a missing value: error | drop the row | impute (training mean / mode)",
                           choices=MISSING_MODES)
    na_values: list[str] = setting([], "extra strings read as missing (beside pandas' NA, NaN, empty)")
    header: bool = setting(True, "the first line names the columns")
    columns: list[str] | None = setting(None, "column names when header=false")
    sep: str = setting(",", "field separator")
    comment: str | None = setting(None, "lines starting with this character are skipped")
    use_sensitive_as_feature: bool = setting(False, "give the sensitive column(s) to the model as inputs")
    batch_size: int = setting(256, "training batch size", ge=1)
    eval_batch_size: int | None = setting(None, "evaluation batch size (null: batch_size)", ge=1)

    @property
    def sensitive_columns(self) -> tuple[str, ...]:
        return tuple(c.strip() for c in str(self.sensitive or "").split(",") if c.strip())

    def sensitive_as_feature(self) -> bool:
        return self.use_sensitive_as_feature

    def resolve(self, name: str | None) -> Path | None:
        if name in (None, ""):
            return None
        path = Path(str(name)).expanduser()
        return path if path.is_absolute() or self.root in (None, "") else Path(str(self.root)).expanduser() / path

    def data_paths(self) -> tuple[Path, Path | None]:
        """(training file, test file or None)."""
        first = self.resolve(self.path) or self.resolve(self.train_path)
        if first is None:
            raise ConfigError("dataset.path: no data file; set dataset.path=<file.csv> (or dataset.train_path and "
                              "dataset.test_path)")
        return first, self.resolve(self.test_path)

    def table_spec(self) -> TableSpec:
        if not self.target:
            raise ConfigError("dataset.target: not set; name the label column, e.g. dataset.target=income")
        if not self.positive:
            raise ConfigError(f"dataset.positive: not set; give the value(s) of {self.target} meaning the positive "
                              "class, e.g. dataset.positive=[1]")
        if not self.sensitive_columns:
            raise ConfigError("dataset.sensitive: not set; name the sensitive column(s), e.g. dataset.sensitive=race")
        if not self.header and not self.columns:
            raise ConfigError("dataset.columns: header=false needs the column names")

        def text(values):
            return tuple(str(v).strip() for v in values)

        return TableSpec(
            target=self.target, positive=text(self.positive), sensitive=self.sensitive_columns,
            negative=None if self.negative is None else text(self.negative),
            sensitive_bins={k: tuple(float(e) for e in v) for k, v in self.sensitive_bins.items()},
            groups={k: text(v) for k, v in self.groups.items()},
            features=None if self.features is None else tuple(self.features), drop=tuple(self.drop),
            categorical=None if self.categorical is None else tuple(self.categorical),
            categories={k: text(v) for k, v in self.categories.items()}, missing=self.missing,
            use_sensitive_as_feature=self.sensitive_as_feature(),
            partition_column=self.partition_column if self.partition == "column" else None,
            merge_groups_below=self.merge_groups_below,
            fmt=TableFormat(header=self.header, columns=tuple(self.columns or ()), sep=self.sep,
                            comment=self.comment, na_values=tuple(self.na_values)))

    def preflight(self) -> None:
        """The data files exist and the column keys are complete."""
        self.table_spec()
        for path in self.data_paths():
            if path is not None and not path.is_file():
                raise ConfigError(f"dataset.{'root' if self.root else 'path'}: {path} does not exist")

    def load(self, seed: int):
        """The preprocessed table (data/table_loader.py), from the cache when an earlier run stored it."""
        from resfl_lightning.data.table_cache import cached_load_table

        train_path, test_path = self.data_paths()
        return cached_load_table(train_path, test_path, self.table_spec(), test_fraction=self.test_fraction,
                                 seed=seed)

    def group_names(self, seed: int) -> tuple[str, ...]:
        """The sensitive values (combinations, bins) in group-id order; the table is read once and cached, so the
        build that follows reads it back."""
        return tuple(self.load(seed).group_names)

    def build(self, seed: int):
        """Read and preprocess the table, then shard its training rows over the clients."""
        from resfl_lightning.data.tabular import federated_tabular_data

        table = self.load(seed)
        self.check_loaded(table)
        log.info("dataset %s: groups %s", self.name, ", ".join(f"{i}={g}" for i, g in enumerate(table.group_names)))
        data = federated_tabular_data(
            table.X_train, table.y_train, table.s_train, table.X_test, table.y_test, table.s_test,
            num_groups=len(table.group_names), seed=seed, num_clients=self.num_clients,
            reserve_fraction=self.reserve_fraction, val_fraction=self.val_fraction, batch_size=self.batch_size,
            eval_batch_size=self.eval_batch_size, partition=self.partition, dirichlet_alpha=self.dirichlet_alpha,
            dirichlet_centre=self.dirichlet_centre, loader=self.loader, group_names=tuple(table.group_names),
            feature_names=tuple(table.feature_names), client_labels=table.client_labels,
            small_clients=self.small_clients)
        check_client_count(self, data)
        return data

    def check_loaded(self, table) -> None:
        """protected_group against the groups found in the data."""
        names = table.group_names
        if self.protected_group is not None and self.protected_group >= len(names):
            raise ConfigError(f"dataset.protected_group: {self.protected_group}, but the data has {len(names)} "
                              f"groups: {', '.join(f'{i}={g}' for i, g in enumerate(names))}")


def check_client_count(ds: FederatedDataset, data) -> None:
    """partition=column: the clients come from the column (after merging / dropping small ones), so num_clients,
    which the config rules and attacks read, must name their count."""
    if ds.partition == "column" and data.num_clients != ds.num_clients:
        names = data.splits.client_names
        raise ConfigError(f"dataset.num_clients: partition_column {ds.partition_column!r} gives {data.num_clients} "
                          f"clients ({', '.join(names[:10])}{' ...' if len(names) > 10 else ''}); set "
                          f"dataset.num_clients={data.num_clients}")
