"""`resfl data` (resfl_lightning/cli/data.py, data/facts.py): the rows (images, persons) per split and client, the
group sizes and positive rates it reports equal pandas' counts on the data files (or annotations) at the split indices
the data module exposes, and --json carries the same facts as the tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from resfl_lightning.cli.data import gather
from resfl_lightning.data.facts import SMALL_GROUP_TEST_ITEMS
from resfl_lightning.data.federated import build_federated_data
from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config, write_loans

ADULT_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
                 "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
                 "income"]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RESFL_CACHE_DIR", str(tmp_path / "cache"))


def splits_of(*overrides: str):
    """The data module's splits for the same overrides (built again: the splits depend only on the seed)."""
    cfg = load_config(compose_config(*overrides))
    return build_federated_data(cfg.dataset, seed=cfg.seed, printer=lambda *a: None).splits


def index_sets(splits) -> dict[tuple[str, str | None], np.ndarray]:
    names = list(splits.client_names) or [str(i) for i in range(len(splits.clients))]
    out = {}
    for name, c in zip(names, splits.clients, strict=True):
        out[("train", name)], out[("val", name)] = c.train, c.val
    out[("train", None)] = np.concatenate([c.train for c in splits.clients])
    out[("val", None)] = np.concatenate([c.val for c in splits.clients])
    out[("test", None)], out[("reserve", None)] = splits.test, splits.reserve
    return out


def assert_rows_match(facts: dict, sets: dict, frame: pd.DataFrame, group: str, positive: pd.Series) -> None:
    """Every split entry of `facts` against pandas on the frame's rows at that split's indices."""
    assert {(r["split"], r["client"]) for r in facts["splits"]} == set(sets)
    for r in facts["splits"]:
        rows = frame.iloc[sets[(r["split"], r["client"])]]
        assert r["items"] == len(rows)
        counts = rows[group].value_counts()
        assert r["groups"] == {g: int(counts.get(g, 0)) for g in facts["group_names"]}
        rate = positive.iloc[sets[(r["split"], r["client"])]].groupby(rows[group]).mean()
        for g in facts["group_names"]:
            expected = rate.get(g)
            assert r["positive_rate"][g] == (pytest.approx(expected, abs=1e-12) if expected is not None else None)
        assert r["positive_rate_all"] == pytest.approx(positive.iloc[sets[(r["split"], r["client"])]].mean())


def test_adult_facts_equal_pandas_on_the_uci_files(adult_dir):
    keys = ["dataset=adult", f"dataset.root={adult_dir}"]
    facts = gather(keys)
    # adult.data's rows then adult.test's, rows with a missing value ("?") dropped (dataset.missing=drop)
    read = {"header": None, "names": ADULT_COLUMNS, "skipinitialspace": True, "na_values": ["?"], "comment": "|"}
    frame = pd.concat([pd.read_csv(adult_dir / name, **read).dropna() for name in ("adult.data", "adult.test")],
                      ignore_index=True)
    assert facts["group_names"] == ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"]
    assert_rows_match(facts, index_sets(splits_of(*keys)), frame, "race", frame["income"].str.startswith(">50K"))
    test = frame.iloc[splits_of(*keys).test]["race"].value_counts()
    assert facts["small_groups"] == {g: int(n) for g, n in test.items() if n < SMALL_GROUP_TEST_ITEMS} == {}
    assert facts["protected_group"] == {"index": 1, "name": "Black", "from": "dataset.protected_group"}


def test_csv_facts_per_region_client_equal_pandas(tmp_path):
    write_loans(tmp_path / "train.csv", n=600, seed=1)
    write_loans(tmp_path / "test.csv", n=150, seed=2)
    keys = ["dataset=csv", f"dataset.train_path={tmp_path / 'train.csv'}", f"dataset.test_path={tmp_path / 'test.csv'}",
            "dataset.test_fraction=0", "dataset.target=approved", "dataset.positive=[yes]", "dataset.sensitive=race",
            "dataset.partition=column", "dataset.partition_column=region", "dataset.num_clients=4"]
    facts = gather(keys)
    frame = pd.concat([pd.read_csv(tmp_path / "train.csv"), pd.read_csv(tmp_path / "test.csv")], ignore_index=True)
    sets = index_sets(splits_of(*keys))
    assert_rows_match(facts, sets, frame, "race", frame["approved"] == "yes")
    for (_, client), rows in sets.items():  # each client is one region's rows
        if client is not None:
            assert set(frame.iloc[rows]["region"]) == {client}
    # the region's training-file rows are its client's train + val rows, less those drawn into the reserve
    reserve = set(sets[("reserve", None)].tolist())
    for region in ("east", "north", "south", "west"):
        mine = [i for i in np.flatnonzero(frame["region"].iloc[:600] == region) if i not in reserve]
        got = sum(r["items"] for r in facts["splits"] if r["client"] == region)
        assert got == len(mine)
    test_counts = frame.iloc[600:]["race"].value_counts()
    assert facts["small_groups"] == {g: int(n) for g, n in test_counts.items() if n < SMALL_GROUP_TEST_ITEMS}
    assert "Asian" in facts["small_groups"]  # 10% of 150 test rows


def test_synthetic_facts_equal_pandas_on_the_annotations(tmp_path):
    keys = ["dataset=synthetic", "dataset.num_images=40", "dataset.image_size=64", "dataset.extra_reserve_images=8",
            f"dataset.cache_dir={tmp_path / 'scenes'}", "dataset.num_clients=2"]
    facts = gather(keys)
    cfg = load_config(compose_config(*keys))
    data = build_federated_data(cfg.dataset, seed=cfg.seed, printer=lambda *a: None)
    ann = data.source.annotations
    persons = pd.DataFrame({"image": ann.image_index, "group": ann.groups})
    names = ["light", "medium", "dark"]
    assert facts["group_names"] == names and facts["unit"] == "images"
    sets = index_sets(data.splits)
    for r in facts["splits"]:
        images = sets[(r["split"], r["client"])]
        mine = persons[persons["image"].isin(images)]
        assert (r["items"], r["persons"]) == (len(images), len(mine))
        counts = mine.loc[mine["group"] >= 0, "group"].value_counts()
        assert r["groups"] == {n: int(counts.get(k, 0)) for k, n in enumerate(names)}
        assert r["unknown_group"] == int((mine["group"] < 0).sum())
        assert "positive_rate" not in r
    totals = [r for r in facts["splits"] if r["client"] is None]
    assert sum(r["items"] for r in totals) == 48 and sum(r["persons"] for r in totals) == len(persons)


def test_json_and_tables_carry_the_same_facts(tmp_path, capsys, monkeypatch):
    from resfl_lightning import cli

    monkeypatch.chdir(tmp_path)
    write_loans(tmp_path / "loans.csv")
    keys = ["dataset=csv", "dataset.path=loans.csv", "dataset.target=approved", "dataset.positive=[yes]",
            "dataset.sensitive=race", "dataset.protected_group=Black"]
    assert cli.main(["data", "--json", *keys]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts == json.loads(json.dumps(gather(keys)))
    assert facts["protected_group"] == {"index": 1, "name": "Black", "from": "dataset.protected_group"}
    monkeypatch.setenv("COLUMNS", "160")
    assert cli.main(["data", *keys]) == 0
    text = capsys.readouterr().out
    test_row = next(r for r in facts["splits"] if r["split"] == "test")
    cells = [test_row["items"], *test_row["groups"].values()]
    assert any(line.split("│")[1:-1] and [c.strip() for c in line.split("│")[1:-1]][:2 + len(cells)] ==
               ["test", "all", *[f"{c:,}" for c in cells]] for line in text.splitlines())
    assert f"SMALL_GROUP_TEST_ITEMS={SMALL_GROUP_TEST_ITEMS}" in text and "display hint" in text
    assert ", ".join(f"{g} ({n})" for g, n in facts["small_groups"].items()) in text
    assert "1=Black, dataset.protected_group" in text
