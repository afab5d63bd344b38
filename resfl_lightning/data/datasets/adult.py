"""`dataset=adult`: UCI Adult ("Census Income", CC BY 4.0), income > 50K with race or sex as the sensitive
attribute: the CSV loader (data/datasets/csv.py) with Adult's column choices in conf/dataset/adult.yaml, plus Adult's
own keys (download with SHA-256 check, drop_sensitive, the checked feature width). Clients share adult.data (IID
stratified by group, or Dirichlet); the test split is adult.test; the attack reserve is carved from adult.data."""

from __future__ import annotations

from dataclasses import dataclass

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.fields import setting
from resfl_lightning.data.adult import ADULT_URL, SENSITIVE_GROUPS, adult_feature_names
from resfl_lightning.data.datasets.csv import CsvDataset, bins_are_increasing, one_source

ADULT_FILES = ("adult.data", "adult.test")


def expected_num_features(ds: AdultDataset) -> int:
    """Width of the preprocessed Adult features (105, less the sensitive block when dropped and the partition
    column's block when clients come from it)."""
    drop = ((ds.sensitive,) if ds.drop_sensitive else ()) + ((ds.partition_column,) if ds.partition == "column" else ())
    return len(adult_feature_names(tuple(c for c in drop if c)))


def adult_test_file_is_the_test_split(ds: AdultDataset) -> None:
    if ds.test_fraction != 0.0:
        raise ConfigError(f"dataset.test_fraction: {ds.name} is tested on its own test file, so the training file is "
                          f"not split for testing; set it to 0 (got {ds.test_fraction})")


def feature_count_matches(ds: AdultDataset) -> None:
    expected = expected_num_features(ds)
    if ds.num_features != expected:
        raise ConfigError(f"dataset.num_features: Adult with sensitive={ds.sensitive} and drop_sensitive="
                          f"{ds.drop_sensitive} has {expected} features, got {ds.num_features}; set "
                          f"dataset.num_features={expected}")


def sensitive_feature_key_is_drop_sensitive(ds: AdultDataset) -> None:
    if ds.use_sensitive_as_feature is not None:
        raise ConfigError("dataset.use_sensitive_as_feature: Adult's key for it is dataset.drop_sensitive "
                          f"(drop_sensitive=true leaves the {ds.sensitive} columns out); leave this one null")


@dataclass(kw_only=True)
class AdultDataset(CsvDataset):
    checks = (one_source, bins_are_increasing, adult_test_file_is_the_test_split, feature_count_matches,
              sensitive_feature_key_is_drop_sensitive)
    supports_column_partition = True  # e.g. occupation: conf/scenario/adult_occupation.yaml

    task: str = setting("classification", "income > 50K", choices=("classification",))
    root: str | None = setting(None, "folder with adult.data and adult.test")
    download: bool = setting(False, "fetch the two files from UCI into root (checked against their SHA-256)")
    sensitive: str = setting("race", "race (5 groups) | sex (2 groups)", choices=tuple(SENSITIVE_GROUPS))
    protected_groups: dict[str, int] = setting({}, "per sensitive attribute, the group protected_group defaults to")
    drop_sensitive: bool = setting(False, "remove the sensitive one-hot block from the features")
    use_sensitive_as_feature: bool | None = setting(None, "Adult: null (set by drop_sensitive)")
    num_features: int = setting(105, "feature width, checked against the preprocessing", ge=1)
    test_fraction: float = setting(0.0, "0: the test split is adult.test", ge=0, lt=1)

    def sensitive_as_feature(self) -> bool:
        return not self.drop_sensitive

    def preflight(self) -> None:
        """dataset.root set and holding the UCI files (or download allowed)."""
        root = self.resolve(".")
        if self.root in (None, ""):
            raise ConfigError(f"dataset.root: not set. Point it at the folder holding {' and '.join(ADULT_FILES)} "
                              f"(dataset.root=/path/to/adult or ADULT_ROOT=/path/to/adult), from {ADULT_URL}")
        missing = [name for name in ADULT_FILES if not (root / name).is_file()]
        if missing and not self.download:
            raise ConfigError(f"dataset.root: {root} lacks {', '.join(missing)} (expected {' and '.join(ADULT_FILES)} "
                              f"from {ADULT_URL}); fix dataset.root or set dataset.download=true")
        self.table_spec()

    def load(self, seed: int):
        """The UCI files fetched when asked and checked against their SHA-256 (a warning on a mismatch), then the
        CSV loader with Adult's columns."""
        from resfl_lightning.data.adult import download_adult, verify_adult_checksum

        self.preflight()
        train_path, test_path = self.data_paths()
        if self.download:
            download_adult(train_path.parent, ADULT_URL)
        for path in (train_path, test_path):
            verify_adult_checksum(path)
        return super().load(seed)

    def build(self, seed: int):
        """The CSV loader's federated data (from `load`), its feature width checked against the config."""
        data = super().build(seed)
        if data.num_features != self.num_features:  # the expected count and the loader must agree
            raise ConfigError(f"dataset.num_features: the loaded data has {data.num_features} features, "
                              f"config says {self.num_features}")
        return data
