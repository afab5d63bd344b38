"""`dataset=adult`: UCI Adult ("Census Income", CC BY 4.0), income > 50K with race or sex as the sensitive
attribute. Clients share adult.data (IID stratified by group, or Dirichlet); the test split is adult.test; the attack
reserve is carved from adult.data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.fields import setting
from resfl_lightning.data.adult import ADULT_URL, SENSITIVE_GROUPS, adult_feature_names
from resfl_lightning.data.datasets.base import FederatedDataset

ADULT_FILES = ("adult.data", "adult.test")


def expected_num_features(ds: AdultDataset) -> int:
    """Width of the preprocessed Adult features (105, less the sensitive block when dropped)."""
    return len(adult_feature_names((ds.sensitive,) if ds.drop_sensitive else ()))


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


@dataclass(kw_only=True)
class AdultDataset(FederatedDataset):
    checks = (adult_test_file_is_the_test_split, feature_count_matches)

    task: str = setting("classification", "income > 50K", choices=("classification",))
    root: str | None = setting(None, "folder with adult.data and adult.test")
    download: bool = setting(False, "fetch the two files from UCI into root (checked against their SHA-256)")
    sensitive: str = setting("race", "race (5 groups) | sex (2 groups)", choices=tuple(SENSITIVE_GROUPS))
    protected_groups: dict[str, int] = setting({}, "per sensitive attribute, the group protected_group defaults to")
    drop_sensitive: bool = setting(False, "remove the sensitive one-hot block from the features")
    num_features: int = setting(105, "feature width, checked against the preprocessing", ge=1)
    test_fraction: float = setting(0.0, "0: the test split is adult.test", ge=0, lt=1)
    batch_size: int = setting(256, "training batch size", ge=1)
    eval_batch_size: int | None = setting(None, "evaluation batch size (null: batch_size)", ge=1)

    @property
    def root_path(self) -> Path | None:
        return None if self.root in (None, "") else Path(str(self.root)).expanduser()

    def preflight(self) -> None:
        """dataset.root set and holding the UCI files (or download allowed)."""
        root = self.root_path
        if root is None:
            raise ConfigError(f"dataset.root: not set. Point it at the folder holding {' and '.join(ADULT_FILES)} "
                              f"(dataset.root=/path/to/adult or ADULT_ROOT=/path/to/adult), from {ADULT_URL}")
        missing = [name for name in ADULT_FILES if not (root / name).is_file()]
        if missing and not self.download:
            raise ConfigError(f"dataset.root: {root} lacks {', '.join(missing)} (expected {' and '.join(ADULT_FILES)} "
                              f"from {ADULT_URL}); fix dataset.root or set dataset.download=true")

    def build(self, seed: int):
        """IID (or Dirichlet) client shards of adult.data, adult.test as the test split."""
        from resfl_lightning.data.adult import load_adult
        from resfl_lightning.data.tabular import federated_tabular_data

        self.preflight()
        adult = load_adult(self.root_path, sensitive=self.sensitive, download=self.download,
                           drop_sensitive=self.drop_sensitive)
        if adult.X_train.shape[1] != self.num_features:  # the expected count and the loader must agree
            raise ConfigError(f"dataset.num_features: the loaded data has {adult.X_train.shape[1]} features, "
                              f"config says {self.num_features}")
        return federated_tabular_data(
            adult.X_train, adult.y_train, adult.s_train, adult.X_test, adult.y_test, adult.s_test,
            num_groups=len(adult.group_names), seed=seed, num_clients=self.num_clients,
            reserve_fraction=self.reserve_fraction, val_fraction=self.val_fraction, batch_size=self.batch_size,
            eval_batch_size=self.eval_batch_size, partition=self.partition, dirichlet_alpha=self.dirichlet_alpha,
            dirichlet_centre=self.dirichlet_centre, loader=self.loader, group_names=tuple(adult.group_names),
            feature_names=tuple(adult.feature_names))
