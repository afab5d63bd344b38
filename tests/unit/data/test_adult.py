"""UCI Adult reader against the real files (shared_data) and an independent pandas + scikit-learn pipeline."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.preprocessing import StandardScaler

from resfl_lightning.data.adult import ADULT_SHA256, load_adult, verify_adult_checksum

COLS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation", "relationship",
        "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", "income"]
CONTINUOUS = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]


@pytest.fixture(scope="module")
def adult_race(adult_dir: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the originals must pass the checksum without a warning
        return load_adult(adult_dir, sensitive="race")


def _names_categories(names_file: Path) -> dict[str, list[str]]:
    """Category lists straight from adult.names (independent of the module's constants)."""
    cats = {}
    for line in names_file.read_text().splitlines():
        if ":" in line and not line.startswith("|") and "continuous" not in line:
            key, values = line.split(":", 1)
            cats[key.strip()] = [v.strip() for v in values.strip().rstrip(".").split(",")]
    return cats


def _reference(adult_dir: Path, sensitive: str):
    """The README's pandas recipe + one-hot over adult.names categories + StandardScaler fitted on train."""
    frames = []
    for name, skip in (("adult.data", 0), ("adult.test", 1)):
        df = pd.read_csv(adult_dir / name, header=None, names=COLS, sep=",", skipinitialspace=True,
                         na_values="?", skiprows=skip)
        frames.append(df.dropna().reset_index(drop=True))
    train, test = frames
    cats = _names_categories(adult_dir / "adult.names")
    scaler = StandardScaler().fit(train[CONTINUOUS].to_numpy(float))
    out = []
    for df in (train, test):
        onehot = [pd.get_dummies(pd.Categorical(df[c], categories=cats[c])).to_numpy(float)
                  for c in COLS[:-1] if c not in CONTINUOUS]
        x = np.concatenate([scaler.transform(df[CONTINUOUS].to_numpy(float)), *onehot], axis=1)
        y = df["income"].str.rstrip(".").eq(">50K").to_numpy().astype(int)
        out.append((x, y, df[sensitive].to_numpy()))
    return out


def test_counts_and_rates(adult_race):
    d = adult_race
    assert d.X_train.shape == (30162, 105) and d.X_test.shape == (15060, 105)
    assert (d.dropped_train, d.dropped_test) == (32561 - 30162, 16281 - 15060)
    assert d.y_train.mean() == pytest.approx(7508 / 30162) and abs(d.y_train.mean() - 0.249) < 1e-3
    assert d.y_test.mean() == pytest.approx(3700 / 15060)
    assert d.group_names == ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"]
    assert len(d.feature_names) == 105 and d.feature_names[:6] == CONTINUOUS
    assert d.X_train.dtype == np.float32 and d.y_train.dtype == np.int64 and d.s_train.dtype == np.int64
    np.testing.assert_allclose(d.X_train[:, :6].astype(np.float64).mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(d.X_train[:, :6].astype(np.float64).std(0), 1, atol=1e-5)


@pytest.mark.parametrize("sensitive", ["race", "sex"])
def test_matches_pandas_sklearn_reference(adult_dir: Path, adult_race, sensitive: str):
    d = adult_race if sensitive == "race" else load_adult(adult_dir, sensitive="sex")
    (xr, yr, sr), (xt, yt, st) = _reference(adult_dir, sensitive)
    np.testing.assert_allclose(d.X_train, xr, atol=1e-5)
    np.testing.assert_allclose(d.X_test, xt, atol=1e-5)
    np.testing.assert_array_equal(d.y_train, yr)
    np.testing.assert_array_equal(d.y_test, yt)
    np.testing.assert_array_equal(np.array(d.group_names)[d.s_train], sr)
    np.testing.assert_array_equal(np.array(d.group_names)[d.s_test], st)
    if sensitive == "sex":
        assert d.group_names == ["Male", "Female"]


def test_drop_sensitive_removes_its_columns(adult_dir: Path):
    d = load_adult(adult_dir, sensitive="sex", drop_sensitive=True, verify=False)
    assert d.X_train.shape[1] == 103 and not any(n.startswith("sex=") for n in d.feature_names)


def test_checksums(adult_dir: Path, tmp_path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert verify_adult_checksum(adult_dir / "adult.data") and verify_adult_checksum(adult_dir / "adult.test")
    copy = tmp_path / "adult.test"
    shutil.copy(adult_dir / "adult.test", copy)
    with copy.open("a") as fh:
        fh.write("\n")
    with pytest.warns(UserWarning, match=r"adult\.test has sha256 .* not the UCI original"):
        assert not verify_adult_checksum(copy)
    other = tmp_path / "my_adult.csv"  # not an original name: nothing to compare with
    shutil.copy(copy, other)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert verify_adult_checksum(other)


def test_download_from_mirror_verifies_sha(adult_dir: Path, tmp_path: Path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name in ADULT_SHA256:
        shutil.copy(adult_dir / name, mirror / name)
    target = tmp_path / "data"
    with pytest.raises(FileNotFoundError, match=r"adult\.data not found.*archive\.ics\.uci\.edu.*download=True"):
        load_adult(target)
    d = load_adult(target, download=True, url=mirror.as_uri() + "/")
    assert d.X_train.shape == (30162, 105) and (target / "adult.test").is_file()
    bad = tmp_path / "bad_mirror"
    bad.mkdir()
    (bad / "adult.data").write_text("not adult\n")
    with pytest.raises(ValueError, match=r"adult\.data has sha256 .* expected 5b002646"):
        load_adult(tmp_path / "data2", download=True, url=bad.as_uri() + "/")
    assert not (tmp_path / "data2" / "adult.data").exists()


GOOD = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, "
    "United-States, <=50K",
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, "
    "United-States, >50K",
    "38, ?, 215646, HS-grad, 9, Divorced, Handlers-cleaners, Not-in-family, Black, Female, 0, 0, 40, ?, <=50K",
]


def _write(root: Path, data_lines: list[str], test_lines: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "adult.data").write_text("\n".join(data_lines) + "\n\n")
    (root / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(test_lines) + "\n")
    return root


def test_small_files_parse(tmp_path: Path):
    test_lines = [line.replace("<=50K", "<=50K.").replace(">50K", ">50K.") for line in GOOD]
    with pytest.warns(UserWarning, match="sha256"):  # not the UCI originals
        d = load_adult(_write(tmp_path / "a", GOOD, test_lines), sensitive="sex")
    assert d.X_train.shape == (2, 105) and (d.dropped_train, d.dropped_test) == (1, 1)
    np.testing.assert_array_equal(d.y_train, [0, 1])
    np.testing.assert_array_equal(d.y_test, [0, 1])
    np.testing.assert_array_equal(d.s_train, [0, 0])


@pytest.mark.parametrize("bad_line, text", [
    ("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, White, Male, 2174, 0, 40, United-States, <=50K",
     "expected 15 comma-separated fields, got 14"),
    ("x9, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, "
     "United-States, <=50K", "column age must be an integer"),
    ("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, Whyte, Male, 2174, 0, 40, "
     "United-States, <=50K", "column race has unknown category 'Whyte'"),
    ("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, "
     "United-States, 50K", "income must be"),
])
def test_malformed_line_names_file_and_line(tmp_path: Path, bad_line: str, text: str):
    root = _write(tmp_path / "m", [*GOOD, bad_line], GOOD)
    with pytest.warns(UserWarning), pytest.raises(ValueError) as err:
        load_adult(root)
    assert f"{root / 'adult.data'} line 4: {text}" in str(err.value)


def test_bad_sensitive_name(adult_dir: Path):
    with pytest.raises(ValueError, match="'age'"):
        load_adult(adult_dir, sensitive="age")


def test_occupation_scenario_gives_one_client_per_occupation_without_its_columns(adult_dir):
    """scenario=adult_occupation: 14 clients, each holding exactly the rows of one occupation, and the model's inputs
    lose occupation's 14 one-hot columns (the feature-count check used to demand 105)."""
    from resfl_lightning.analysis.run_settings import composed_settings
    from resfl_lightning.config.load import instantiate
    from resfl_lightning.data.datasets.base import FederatedDataset
    from resfl_lightning.run_config.load import load_config

    cfg = load_config(composed_settings(["dataset=adult", f"dataset.root={adult_dir}", "scenario=adult_occupation"]))
    ds = instantiate(cfg.dataset, FederatedDataset, "dataset")
    data = ds.build(0)
    assert data.num_clients == 14 and data.x.shape[1] == 91
    names = list(data.splits.client_names)
    frame = pd.read_csv(adult_dir / "adult.data", header=None, skipinitialspace=True, na_values=["?"]).dropna()
    counts = frame[6].value_counts()  # occupation, column 7 of adult.names
    sizes = {name: len(data.splits.client_indices(i)) for i, name in enumerate(names)}
    reserve = len(data.splits.reserve)
    assert sum(sizes.values()) + reserve == len(frame)
    assert all(sizes[name] <= counts[name] for name in names)
