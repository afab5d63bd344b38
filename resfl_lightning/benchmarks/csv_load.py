"""CSV load + partition time of `dataset=csv` (data/table_loader.py, data/partition.py): a generated table of
`rows` x `columns` (numeric columns, a few categorical ones, a sensitive column with 4 groups and a region column)
is written to a temporary file, then read, checked, preprocessed and split into clients, each stage timed."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from resfl_lightning.data.table_loader import TableSpec, load_table
from resfl_lightning.data.tabular import federated_tabular_data

CATEGORICAL = 5  # of the feature columns, these many hold categories (8 values each)


def write_table(path: Path, rows: int, columns: int, seed: int = 0) -> None:
    """`columns` feature columns plus target, sensitive and region columns."""
    rng = np.random.default_rng(seed)
    data = {f"num{i}": rng.normal(size=rows).astype(np.float32) for i in range(columns - CATEGORICAL)}
    data |= {f"cat{i}": rng.choice([f"c{k}" for k in range(8)], size=rows) for i in range(CATEGORICAL)}
    data["race"] = rng.choice(["a", "b", "c", "d"], size=rows, p=[0.5, 0.3, 0.15, 0.05])
    data["region"] = rng.choice([f"r{k}" for k in range(20)], size=rows)
    data["label"] = rng.integers(0, 2, size=rows)
    pd.DataFrame(data).to_csv(path, index=False, float_format="%.5g")


def measure(rows: int = 1_000_000, columns: int = 50, clients: int = 20) -> dict[str, float]:
    """Seconds to load + preprocess, to partition (iid and by region), and their total; the file size in MB."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.csv"
        write_table(path, rows, columns)
        spec = TableSpec(target="label", positive=("1",), sensitive=("race",), partition_column="region")
        t0 = time.perf_counter()
        table = load_table(path, None, spec, test_fraction=0.2, seed=0)
        t1 = time.perf_counter()
        common = {"num_groups": 4, "seed": 0, "num_clients": clients, "reserve_fraction": 0.05, "val_fraction": 0.1,
                  "batch_size": 256}
        args = (table.X_train, table.y_train, table.s_train, table.X_test, table.y_test, table.s_test)
        federated_tabular_data(*args, **common)
        t2 = time.perf_counter()
        federated_tabular_data(*args, **common, partition="column", client_labels=table.client_labels)
        t3 = time.perf_counter()
        return {"rows": rows, "columns": columns, "features": table.X_train.shape[1],
                "file_mb": path.stat().st_size / 2**20, "load_s": t1 - t0, "partition_iid_s": t2 - t1,
                "partition_column_s": t3 - t2, "total_s": t3 - t0}


def table(result: dict[str, float]):
    from rich.table import Table

    out = Table(title=f"CSV load + partition: {result['rows']:,} rows x {result['columns']} columns "
                      f"({result['file_mb']:.0f} MB, {result['features']} features)")
    out.add_column("stage")
    out.add_column("seconds", justify="right")
    for key, label in (("load_s", "read + check + preprocess"), ("partition_iid_s", "partition iid (20 clients)"),
                       ("partition_column_s", "partition by column (20 regions)"), ("total_s", "total")):
        out.add_row(label, f"{result[key]:.2f}")
    return out
