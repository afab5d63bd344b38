"""UCI Adult ("Census Income") from the original `adult.data` / `adult.test` text files.

Files: no header, comma + space separated, `?` for missing values, test labels end with `.`, adult.test opens with
the `|1x3 Cross validator` banner. Rows with a missing value are dropped (counted); categoricals are one-hot encoded
over the fixed category lists of adult.names (so train and test align); continuous columns are standardised with
train statistics. y = income > 50K; s = race (White 0, Black 1, Asian-Pac-Islander 2, Amer-Indian-Eskimo 3,
Other 4) or sex (Male 0, Female 1). Licence: CC BY 4.0, Becker & Kohavi (1996), doi:10.24432/C5XW20.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
ADULT_SHA256 = {
    "adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
}
ADULT_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation", "relationship",
    "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", "income",
)  # fmt: skip
ADULT_CONTINUOUS = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
# Category lists in adult.names order.
ADULT_CATEGORIES: dict[str, tuple[str, ...]] = {
    "workclass": ("Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
                  "Without-pay", "Never-worked"),
    "education": ("Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc", "9th",
                  "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool"),
    "marital-status": ("Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
                       "Married-spouse-absent", "Married-AF-spouse"),
    "occupation": ("Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial", "Prof-specialty",
                   "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical", "Farming-fishing", "Transport-moving",
                   "Priv-house-serv", "Protective-serv", "Armed-Forces"),
    "relationship": ("Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried"),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": ("United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
                       "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba", "Iran",
                       "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico", "Portugal",
                       "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan", "Haiti", "Columbia",
                       "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand", "Yugoslavia", "El-Salvador",
                       "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands"),
}
ADULT_CATEGORICAL = tuple(c for c in ADULT_COLUMNS[:-1] if c not in ADULT_CONTINUOUS)
SENSITIVE_GROUPS: dict[str, tuple[str, ...]] = {
    "race": ("White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"),
    "sex": ("Male", "Female"),
}
LABELS = {"<=50K": 0, ">50K": 1}


@dataclass
class AdultData:
    """Preprocessed Adult split: float32 features, int64 labels (income > 50K) and sensitive group ids."""

    X_train: np.ndarray
    y_train: np.ndarray
    s_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    s_test: np.ndarray
    feature_names: list[str]
    group_names: list[str]
    sensitive: str = "race"
    dropped_train: int = 0  # rows with a missing value (`?`)
    dropped_test: int = 0


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_adult_checksum(path: Path) -> bool:
    """True when a file named like a UCI original matches its published SHA-256; warns (does not fail) otherwise."""
    expected = ADULT_SHA256.get(Path(path).name)
    if expected is None:
        return True
    actual = sha256_of(path)
    if actual != expected:
        warnings.warn(f"{path} has sha256 {actual}, not the UCI original's {expected}; results may not be "
                      "comparable with published Adult numbers", stacklevel=2)
        return False
    return True


def download_adult(root: str | Path, url: str = ADULT_URL) -> None:
    """Fetch adult.data and adult.test into `root` when missing; each download must match its SHA-256."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    url = url if url.endswith("/") else url + "/"
    for name, expected in ADULT_SHA256.items():
        target = root / name
        if target.is_file():
            continue
        partial = target.with_suffix(target.suffix + ".part")
        log.info("downloading %s%s -> %s", url, name, target)
        with urllib.request.urlopen(url + name, timeout=120) as response, open(partial, "wb") as out:  # noqa: S310
            shutil.copyfileobj(response, out)
        actual = sha256_of(partial)
        if actual != expected:
            partial.unlink()
            raise ValueError(f"download of {url + name} has sha256 {actual}, expected {expected}; not saved")
        partial.replace(target)


def read_adult_file(path: str | Path) -> tuple[list[list[str]], int]:
    """(complete rows as 15 stripped strings, number of rows dropped for a `?`); ValueError names file and line."""
    path = Path(path)
    rows: list[list[str]] = []
    dropped = 0
    with open(path, encoding="ascii", errors="strict") as fh:
        try:
            lines = fh.read().splitlines()
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not the ASCII Adult text file: {err}") from err
    for line_no, line in enumerate(lines, start=1):
        if not line.strip() or (line_no == 1 and line.startswith("|")):  # blank tail / adult.test banner
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(ADULT_COLUMNS):
            raise ValueError(f"{path} line {line_no}: expected {len(ADULT_COLUMNS)} comma-separated fields, "
                             f"got {len(fields)}: {line[:80]!r}")
        fields[-1] = fields[-1].removesuffix(".")  # adult.test labels end with "."
        problem = _field_problem(fields)
        if problem:
            raise ValueError(f"{path} line {line_no}: {problem}")
        if "?" in fields:
            dropped += 1
            continue
        rows.append(fields)
    return rows, dropped


def _field_problem(fields: list[str]) -> str:
    for column, value in zip(ADULT_COLUMNS, fields, strict=True):
        if value == "?" and column != "income":
            continue
        if column in ADULT_CONTINUOUS:
            try:
                int(value)
            except ValueError:
                return f"column {column} must be an integer, got {value!r}"
        elif column == "income":
            if value not in LABELS:
                return f"income must be <=50K or >50K (test: with a trailing '.'), got {value!r}"
        elif value not in ADULT_CATEGORIES[column]:
            return f"column {column} has unknown category {value!r}"
    return ""


def adult_feature_names(drop: tuple[str, ...] = ()) -> list[str]:
    """Continuous columns, then one `column=category` per category of each categorical column."""
    names = [c for c in ADULT_CONTINUOUS if c not in drop]
    for column in ADULT_CATEGORICAL:
        if column not in drop:
            names += [f"{column}={v}" for v in ADULT_CATEGORIES[column]]
    return names


def _encode(rows: list[list[str]], drop: tuple[str, ...]) -> np.ndarray:
    """Raw (unstandardised) continuous values followed by one-hot categoricals, float64 (n, d)."""
    idx = {c: i for i, c in enumerate(ADULT_COLUMNS)}
    blocks = [np.array([[float(r[idx[c]]) for c in ADULT_CONTINUOUS if c not in drop] for r in rows],
                       dtype=np.float64).reshape(len(rows), -1)]
    for column in ADULT_CATEGORICAL:
        if column in drop:
            continue
        lookup = {v: i for i, v in enumerate(ADULT_CATEGORIES[column])}
        codes = np.array([lookup[r[idx[column]]] for r in rows], dtype=np.int64)
        blocks.append(np.eye(len(lookup), dtype=np.float64)[codes])
    return np.concatenate(blocks, axis=1)


def load_adult(
    root: str | Path,
    sensitive: str = "race",
    download: bool = False,
    *,
    drop_sensitive: bool = False,
    verify: bool = True,
    url: str = ADULT_URL,
) -> AdultData:
    """Load and preprocess Adult from `root`/adult.data and `root`/adult.test (downloaded first if asked).

    drop_sensitive removes the sensitive column's one-hot block from X; verify checks the files' SHA-256 (warning
    on a mismatch).
    """
    if sensitive not in SENSITIVE_GROUPS:
        raise ValueError(f"sensitive must be one of {sorted(SENSITIVE_GROUPS)}, got {sensitive!r}")
    root = Path(root).expanduser()
    paths = {name: root / name for name in ADULT_SHA256}
    missing = [p for p in paths.values() if not p.is_file()]
    if missing and download:
        download_adult(root, url)
    elif missing:
        raise FileNotFoundError(
            f"{missing[0]} not found. Get adult.data and adult.test from {ADULT_URL} "
            f"(UCI dataset 2, https://archive.ics.uci.edu/dataset/2/adult) into {root}, "
            "or call load_adult(..., download=True)")
    if verify:
        for path in paths.values():
            verify_adult_checksum(path)
    train, dropped_train = read_adult_file(paths["adult.data"])
    test, dropped_test = read_adult_file(paths["adult.test"])
    log.info("Adult: dropped %d train and %d test rows with missing values", dropped_train, dropped_test)
    if not train:
        raise ValueError(f"{paths['adult.data']} has no complete rows")

    drop = (sensitive,) if drop_sensitive else ()
    x_train, x_test = _encode(train, drop), _encode(test, drop)
    n_cont = len([c for c in ADULT_CONTINUOUS if c not in drop])
    mean = x_train[:, :n_cont].mean(axis=0)
    std = x_train[:, :n_cont].std(axis=0)
    std[std == 0] = 1.0
    x_train[:, :n_cont] = (x_train[:, :n_cont] - mean) / std
    x_test[:, :n_cont] = (x_test[:, :n_cont] - mean) / std

    groups = SENSITIVE_GROUPS[sensitive]
    s_col = ADULT_COLUMNS.index(sensitive)
    group_id = {g: i for i, g in enumerate(groups)}
    return AdultData(
        X_train=x_train.astype(np.float32),
        y_train=np.array([LABELS[r[-1]] for r in train], dtype=np.int64),
        s_train=np.array([group_id[r[s_col]] for r in train], dtype=np.int64),
        X_test=x_test.astype(np.float32),
        y_test=np.array([LABELS[r[-1]] for r in test], dtype=np.int64),
        s_test=np.array([group_id[r[s_col]] for r in test], dtype=np.int64),
        feature_names=adult_feature_names(drop),
        group_names=list(groups),
        sensitive=sensitive,
        dropped_train=dropped_train,
        dropped_test=dropped_test,
    )
