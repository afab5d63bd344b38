"""The dataset interface: what a dataset declares (its config keys) and the two methods the trainer calls.

A new dataset is one module + one yaml:

    # my_pkg/my_data.py
    @dataclass(kw_only=True)
    class MyDataset(FederatedDataset):
        root: str = setting(doc="folder with the files")      # its own keys, typed and documented

        def build(self, seed: int):                             # every rank, after the processes start
            ...                                                 # -> FederatedTabularData / FederatedDetectionData

    # conf/dataset/my_data.yaml
    _target_: my_pkg.my_data.MyDataset
    name: my_data
    task: classification
    gate_mode: absolute
    recipe: {rounds: 10, local_epochs: 1, lr: 0.01, lr_milestones: []}
    root: /data/mine

The yaml's keys are checked against the class's fields (type, range, choices; an unknown key is an error) before
any work, and `python -m resfl_lightning.train dataset=my_data` trains on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.fields import Section, has_unresolved, setting
from resfl_lightning.config.sections import LoaderSettings, QualitySkewSettings, Recipe


@dataclass(kw_only=True)
class FederatedDataset(Section):
    """The keys every dataset has; subclasses add their own and implement `build`.

    `build(seed)` returns the federated data, an object with
        num_clients, num_groups, num_classes, task ("detection" | "classification"), splits (FederatedSplits),
        train_loader(client_id, seed), val_loader(client_id), test_loader(), reserve_loader(),
        num_train(client_id), train_loader_for(indices, seed), loader_for(indices)
    and, for task="classification", num_features. Two ready containers give all of that from arrays and splits
    (resfl_lightning/data/partition.py: make_federated_splits): FederatedTabularData (batches of x, y, groups;
    trained with TabularNet) and FederatedDetectionData (images + person boxes with groups; trained with YOLOv8).
    The seed is the run seed: the same seed must give the same splits on every rank.
    """

    section = "dataset"

    _target_: str = setting(doc="the dataset class, 'module.Class'")
    name: str = setting(doc="the dataset's name in run names and logs")
    task: str = setting(doc="what the clients learn; picks the client and model",
                        choices=("detection", "classification"))
    gate_mode: str = setting(doc="ufm.gate_mode for this dataset (absolute | relative)",
                             choices=("absolute", "relative"))
    recipe: Recipe = setting(doc="training recipe conf/train.yaml reads (rounds, local_epochs, lr, lr_milestones)")
    num_clients: int = setting(4, "federated clients", ge=1)
    partition: str = setting("iid", "iid: every client sees the group mix; dirichlet: group shares per client; "
                             "column: one client per value of partition_column", choices=("iid", "dirichlet", "column"))
    partition_column: str | None = setting(None, "partition=column: the column naming each item's client (region, "
                                           "hospital, camera)")
    small_clients: str = setting("warn", "a client too small for its train/val split: warn | error (naming it), or "
                                 "merge | drop it (partition=column)", choices=("warn", "error", "merge", "drop"))
    dirichlet_alpha: float = setting(0.5, "Dirichlet concentration of the group shares", gt=0)
    dirichlet_centre: str = setting("uniform", "Dirichlet mean: equal group shares or the global mix",
                                    choices=("uniform", "global"))
    test_fraction: float = setting(0.2, "share held out as the test split", ge=0, lt=1)
    reserve_fraction: float = setting(0.05, "share held out as the attack reserve", ge=0, lt=1)
    val_fraction: float = setting(0.1, "share of each client's shard used for validation", ge=0, lt=1)
    batch_size: int = setting(16, "training batch size", ge=1)
    loader: LoaderSettings = setting(LoaderSettings(), "DataLoader workers")
    protected_group: int | None = setting(None, "the group the fairness attacks protect by default: its index, or "
                                          "its name where the dataset names its groups "
                                          "(run_config/group_names.py)", ge=0)
    quality_skew: QualitySkewSettings | None = setting(None, "scenario=quality_skew (detection data only)")

    supports_column_partition: ClassVar[bool] = False  # True for datasets that read a partition column

    def __post_init__(self) -> None:
        super().__post_init__()
        if not has_unresolved(self):
            partition_keys_agree(self)

    def preflight(self) -> None:
        """Cheap checks in the launching process before any worker starts (files present, licence notice);
        raise ConfigError naming the key to fix. Nothing to check by default."""

    def group_names(self, seed: int) -> tuple[str, ...] | None:
        """The group names in group-id order, read as cheaply as the data allows (a group named by value in the
        config is resolved against them, run_config/group_names.py); None: this dataset names its groups by index
        only."""
        return None

    def build(self, seed: int) -> Any:
        """The federated data (see the class docstring); called on every rank."""
        raise NotImplementedError(f"{type(self).__name__} must implement build(seed)")


def partition_keys_agree(ds: FederatedDataset) -> None:
    """partition=column needs partition_column (and a dataset that reads one); merge / drop need partition=column."""
    if ds.partition == "column":
        if not type(ds).supports_column_partition:
            raise ConfigError(f"dataset.partition: {ds.name} has no partition column; partition=column works with "
                              "dataset=csv and dataset=yolo (use iid or dirichlet)")
        if not ds.partition_column:
            raise ConfigError("dataset.partition_column: partition=column needs the column that names each item's "
                              "client, e.g. dataset.partition_column=region")
    elif ds.small_clients in ("merge", "drop"):
        raise ConfigError(f"dataset.small_clients: {ds.small_clients} needs dataset.partition=column (iid and "
                          "dirichlet clients are equal-sized from num_clients); use warn or error")
