"""dataset=csv: preprocessing against hand computations and scikit-learn, Adult through the CSV loader equal to the
Adult reader, bad input named by file / line / column, a fuzz over malformed CSV files."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from resfl_lightning.config import ConfigError
from resfl_lightning.data.adult import load_adult
from resfl_lightning.data.federated import instantiate_dataset
from resfl_lightning.data.partition import SmallClientWarning
from resfl_lightning.data.table_file import TableFormat
from resfl_lightning.data.table_loader import TableSpec, load_table

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[3]


def people(n: int = 240, seed: int = 0) -> pd.DataFrame:
    """Rows with three race groups, a numeric, a categorical and a region column; y depends on x and race."""
    rng = np.random.default_rng(seed)
    race = rng.choice(["White", "Black", "Asian"], size=n, p=[0.6, 0.25, 0.15])
    x = rng.normal(size=n).round(3)
    job = rng.choice(["clerk", "nurse", "pilot"], size=n)
    region = rng.choice(["north", "south", "east"], size=n)
    y = np.where(x + (race == "White") * 0.5 + rng.normal(scale=0.5, size=n) > 0.3, "yes", "no")
    return pd.DataFrame({"age": rng.integers(18, 80, size=n), "x": x, "job": job, "race": race, "region": region,
                         "approved": y})


def write(df: pd.DataFrame, path: Path) -> Path:
    df.to_csv(path, index=False)
    return path


SPEC = TableSpec(target="approved", positive=("yes",), sensitive=("race",))


def test_preprocessing_matches_scikit_learn_fitted_on_the_training_file(tmp_path):
    train, test = people(200, 0), people(60, 1)
    test.loc[3, "job"] = "astronaut"  # unseen in training: all-zero one-hot block
    t = load_table(write(train, tmp_path / "train.csv"), write(test, tmp_path / "test.csv"), SPEC)
    scaler = StandardScaler().fit(train[["age", "x"]])
    onehot = OneHotEncoder(handle_unknown="ignore", sparse_output=False).fit(train[["job", "region"]])
    expect = np.concatenate([scaler.transform(test[["age", "x"]]), onehot.transform(test[["job", "region"]])], 1)
    np.testing.assert_allclose(t.X_test, expect.astype(np.float32), rtol=1e-6, atol=1e-6)
    assert t.feature_names == ["age", "x", "job=clerk", "job=nurse", "job=pilot", "region=east", "region=north",
                               "region=south"]  # the sensitive column is not an input by default
    assert t.X_test[3, 2:5].sum() == 0 and t.X_test[3, 5:].sum() == 1
    assert t.group_names == ["Asian", "Black", "White"]  # sorted by default
    np.testing.assert_array_equal(t.s_train, pd.Categorical(train.race, ["Asian", "Black", "White"]).codes)
    np.testing.assert_array_equal(t.y_test, (test.approved == "yes").to_numpy().astype(np.int64))


def test_sensitive_column_is_an_input_only_when_asked(tmp_path):
    path = write(people(), tmp_path / "p.csv")
    spec = TableSpec(target="approved", positive=("yes",), sensitive=("race",), drop=("region",))
    off = load_table(path, None, spec, test_fraction=0.25)
    on = load_table(path, None, TableSpec(**{**spec.__dict__, "use_sensitive_as_feature": True}), test_fraction=0.25)
    assert not any(n.startswith("race=") for n in off.feature_names)
    assert [n for n in on.feature_names if n.startswith("race=")] == ["race=Asian", "race=Black", "race=White"]
    assert len(off.y_test) == 60 and len(off.y_train) == 180
    # stratified by group: each group's test share is a quarter of it (+-1 row)
    counts = np.bincount(np.concatenate([off.s_train, off.s_test]))
    assert np.all(np.abs(np.bincount(off.s_test, minlength=3) - counts / 4) <= 1)


def test_groups_from_several_columns_and_numeric_bins(tmp_path):
    df = people()
    path = write(df, tmp_path / "p.csv")
    t = load_table(path, None, TableSpec(target="approved", positive=("yes",), sensitive=("race", "age"),
                                         sensitive_bins={"age": (0, 40, 120)}), test_fraction=0.2)
    expect = {f"{r}|{b}" for r in ("Asian", "Black", "White") for b in ("[0, 40)", "[40, 120)")}
    assert set(t.group_names) == expect and len(t.group_names) == 6
    names = np.array(t.group_names)[np.concatenate([t.s_train, t.s_test])]
    truth = df.race + "|" + np.where(df.age < 40, "[0, 40)", "[40, 120)")
    assert sorted(names) == sorted(truth)


def test_missing_values_error_drop_or_impute(tmp_path):
    df = people(100)
    df["x"] = df["x"].astype(object)
    df.loc[7, "x"] = "?"
    path = write(df, tmp_path / "m.csv")
    fmt = TableFormat(na_values=("?",))
    with pytest.raises(ValueError, match=r"m\.csv line 9 column 'x': missing value"):
        load_table(path, None, TableSpec(target="approved", positive=("yes",), sensitive=("race",), fmt=fmt), 0.2)
    dropped = load_table(path, None, TableSpec(target="approved", positive=("yes",), sensitive=("race",), fmt=fmt,
                                               missing="drop"), 0.2)
    assert dropped.dropped_train == 1 and len(dropped.y_train) + len(dropped.y_test) == 99
    imputed = load_table(path, None, TableSpec(target="approved", positive=("yes",), sensitive=("race",), fmt=fmt,
                                               missing="impute"), 0.2)
    assert len(imputed.y_train) + len(imputed.y_test) == 100 and np.isfinite(imputed.X_train).all()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda df: df.drop(columns="race"), r"no column 'race' \(named by dataset.sensitive\)"),
    (lambda df: df.assign(approved=df.approved.where(df.index != 4, "maybe")),
     r"line 6 column 'approved': unknown target value 'maybe'"),
    (lambda df: df.assign(race="White"), r"give one group \(White\)"),
    (lambda df: df.assign(x=df.x.astype(object).where(df.index != 10, "abc")),
     r"line 12 column 'x': 'abc' is not a number"),
])
def test_bad_input_names_file_line_and_column(tmp_path, edit, message):
    path = write(edit(people(60)), tmp_path / "bad.csv")
    with pytest.raises(ValueError, match=message) as err:
        load_table(path, None, SPEC, test_fraction=0.2)
    assert str(path) in str(err.value)


def test_malformed_rows_are_named(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a,b,y,s\n1,2,yes,u\n3,4,no,v\n5,6,no\n")
    with pytest.raises(ValueError, match=r"rows\.csv line 4: expected 4 fields"):
        load_table(path, None, TableSpec(target="y", positive=("yes",), sensitive=("s",)), 0.3)
    path.write_text("a,b,y,s\n1,2,yes,u\n3,4,no,v,9\n")
    with pytest.raises(ValueError, match=r"rows\.csv: cannot parse.*line 3"):
        load_table(path, None, TableSpec(target="y", positive=("yes",), sensitive=("s",)), 0.3)


def test_test_file_group_must_occur_in_training(tmp_path):
    train, test = people(80, 0), people(20, 1)
    test.loc[2, "race"] = "Martian"
    with pytest.raises(ValueError, match=r"test\.csv line 4 column 'race': group 'Martian' does not occur"):
        load_table(write(train, tmp_path / "train.csv"), write(test, tmp_path / "test.csv"), SPEC)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_csv_files_load_or_fail_with_a_named_error(tmp_path, data):
    """Random damage to a valid file: either it loads to finite arrays, or a ValueError names the file."""
    lines = people(40).to_csv(index=False).splitlines()
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        fields = lines[i].split(",")
        op = data.draw(st.sampled_from(["drop_field", "add_field", "garble", "empty", "blank_line"]))
        j = data.draw(st.integers(0, len(fields) - 1))
        if op == "drop_field":
            fields.pop(j)
        elif op == "add_field":
            fields.insert(j, data.draw(st.text("ab1.-", max_size=3)))
        elif op == "garble":
            fields[j] = data.draw(st.text("xyz019.-\"", max_size=4))
        elif op == "empty":
            fields[j] = ""
        lines[i] = "" if op == "blank_line" else ",".join(fields)
    path = tmp_path / "fuzz.csv"
    path.write_text("\n".join(lines) + "\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    try:
        t = load_table(path, None, SPEC, test_fraction=0.25)
    except ValueError as err:
        assert str(path) in str(err) or "dataset." in str(err), str(err)
    else:
        assert np.isfinite(t.X_train).all() and np.isfinite(t.X_test).all()
        assert set(np.unique(t.y_train)) <= {0, 1} and t.s_train.min() >= 0
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written beside the user's file


def test_adult_through_the_csv_loader_equals_the_adult_reader(adult_dir):
    cfg = OmegaConf.load(REPO / "conf" / "dataset" / "adult.yaml")
    cfg.pop("defaults")
    cfg.root = str(adult_dir)
    ds = instantiate_dataset(cfg)
    t = load_table(*ds.data_paths(), ds.table_spec())
    ref = load_adult(adult_dir, sensitive="race")
    for key in ("X_train", "y_train", "s_train", "X_test", "y_test", "s_test"):
        a, b = getattr(ref, key), getattr(t, key)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), key  # bitwise
    assert t.feature_names == ref.feature_names and t.group_names == ref.group_names
    assert (t.dropped_train, t.dropped_test) == (ref.dropped_train, ref.dropped_test)


def csv_cfg(path: Path, **overrides):
    cfg = OmegaConf.load(REPO / "conf" / "dataset" / "csv.yaml")
    cfg.pop("defaults")
    cfg.merge_with({"path": str(path), "target": "approved", "positive": ["yes"], "sensitive": "race", **overrides})
    return cfg


def test_column_partition_gives_one_client_per_region(tmp_path):
    df = people(300)
    path = write(df, tmp_path / "p.csv")
    data = instantiate_dataset(csv_cfg(path, partition="column", partition_column="region", num_clients=3)).build(0)
    assert data.splits.client_names == ("east", "north", "south")
    assert data.num_features == 5  # age, x, job (3); region is the partition column, not an input
    n_train = len(data.splits.reserve) + sum(len(c.train) + len(c.val) for c in data.splits.clients)
    # every client's rows hold one region, recovered from the row order of the training part
    test_rows = set(data.splits.test.tolist())
    assert not test_rows & set(np.concatenate([data.splits.client_indices(i) for i in range(3)]).tolist())
    assert n_train + len(data.splits.test) == 300 and data.splits.h_tv >= 0
    with pytest.raises(ConfigError, match=r"dataset.num_clients=3"):
        instantiate_dataset(csv_cfg(path, partition="column", partition_column="region", num_clients=4)).build(0)
    with pytest.raises(ConfigError, match="dataset.partition_column"):
        instantiate_dataset(csv_cfg(path, partition="column"))


def test_small_column_clients_are_named_and_merged_dropped_or_refused(tmp_path):
    df = people(300)
    df.loc[:3, "region"] = "island"  # 4 rows: after the test split too few for train + validation
    path = write(df, tmp_path / "p.csv")
    base = {"partition": "column", "partition_column": "region"}
    with pytest.raises(ValueError, match=r"client 'island'"):
        instantiate_dataset(csv_cfg(path, small_clients="error", num_clients=4, **base)).build(0)
    with pytest.warns(SmallClientWarning, match=r"dropped.*client 'island'"):
        dropped = instantiate_dataset(csv_cfg(path, small_clients="drop", num_clients=3, **base)).build(0)
    assert "island" not in dropped.splits.client_names and dropped.num_clients == 3
    with pytest.warns(SmallClientWarning, match=r"merged.*client 'island'"):
        merged = instantiate_dataset(csv_cfg(path, small_clients="merge", num_clients=3, **base)).build(0)
    assert any("island" in n for n in merged.splits.client_names)
    assert all(len(c.val) >= 1 for c in merged.splits.clients)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError, match="dataset.small_clients"):
            instantiate_dataset(csv_cfg(path, small_clients="merge"))  # merge needs partition=column
