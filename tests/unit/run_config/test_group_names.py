"""Groups named by value (resfl_lightning/run_config/group_names.py): a name becomes the index the loaded data gives
that group, for dataset=csv, adult, yolo and the MST datasets, in dataset.protected_group and in the attack keys that
interpolate it; an unknown name is a config error listing the groups; a config naming no group is left untouched,
so today's presets keep their index."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from resfl_lightning.config import ConfigError
from resfl_lightning.run_config.group_names import with_group_indices
from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config, write_loans, write_tiny_yolo

CONF = Path(__file__).resolve().parents[3] / "conf"


def loaded(*overrides: str):
    return load_config(with_group_indices(compose_config(*overrides)))


def csv_keys(path: Path) -> list[str]:
    return ["dataset=csv", f"dataset.path={path}", "dataset.target=approved", "dataset.positive=[yes]",
            "dataset.sensitive=race"]


# The presets' protected groups as their yaml comments state them: Adult race -> Black, sex -> Female; the MST
# datasets' darkest group (mst3: dark, mst10: MST 10).
PRESETS = [(["dataset=adult"], 1), (["dataset=adult", "dataset.sensitive=sex"], 1), (["dataset=synthetic"], 2),
           (["dataset=synthetic", "dataset.grouping=mst10"], 9), (["dataset=facet"], 9), (["dataset=carla"], 9)]


@pytest.mark.parametrize(("overrides", "index"), PRESETS)
@pytest.mark.parametrize("attack", ["attack=clean", "attack=poisoning", "attack=privacy"])
def test_todays_presets_are_left_as_composed(overrides, index, attack):
    cfg = compose_config(*overrides, attack)
    assert with_group_indices(cfg) is cfg  # not copied, not rewritten: the run builds from what it composed
    typed = load_config(cfg)
    assert typed.dataset.protected_group == index
    group = typed.attack.poisoning.target_group if attack == "attack=poisoning" else typed.attack.eod.protected_group
    assert group == index


def test_a_csv_group_by_name_is_its_index_in_the_loaded_data(tmp_path, monkeypatch):
    monkeypatch.setenv("RESFL_CACHE_DIR", str(tmp_path / "cache"))
    csv = tmp_path / "loans.csv"
    write_loans(csv)
    order = sorted(pd.read_csv(csv)["race"].unique())  # the default group order: the values sorted
    composed = compose_config(*csv_keys(csv), "dataset.protected_group=Black", "attack=privacy",
                              "attack.eod.unprotected_group=White")
    typed = load_config(with_group_indices(composed))
    assert typed.dataset.protected_group == typed.attack.eod.protected_group == order.index("Black")
    assert typed.attack.eod.unprotected_group == order.index("White")
    assert composed.dataset.protected_group == "Black"  # the composed config (saved with the run) keeps the name
    from resfl_lightning.data.federated import build_federated_data

    data = build_federated_data(typed.dataset, seed=typed.seed, printer=lambda *a: None)
    assert data.group_names[typed.dataset.protected_group] == "Black"
    listed = loaded(*csv_keys(csv), "+dataset.groups={race:[White,Black,Asian]}", "dataset.protected_group=Asian",
                    "attack=poisoning")
    assert listed.dataset.protected_group == listed.attack.poisoning.target_group == 2


def test_an_adult_group_by_name_is_its_place_in_the_presets_group_list(adult_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("RESFL_CACHE_DIR", str(tmp_path / "cache"))
    groups = yaml.safe_load((CONF / "dataset" / "adult.yaml").read_text())["groups"]
    for sensitive, name in (("race", "Black"), ("race", "Amer-Indian-Eskimo"), ("sex", "Female")):
        typed = loaded("dataset=adult", f"dataset.root={adult_dir}", f"dataset.sensitive={sensitive}",
                       f"dataset.protected_group={name}")
        assert typed.dataset.protected_group == groups[sensitive].index(name)


def test_a_yolo_group_by_name_is_its_index_in_the_groups_file_order(tmp_path):
    data_yaml, groups = write_tiny_yolo(tmp_path / "y")
    keys = ["dataset=yolo", f"dataset.data={data_yaml}", f"dataset.groups_file={groups}"]
    assert loaded(*keys, "dataset.protected_group=light").dataset.protected_group == 1  # sorted: dark, light
    assert loaded(*keys, "dataset.groups=[light,dark]", "dataset.protected_group=light").dataset.protected_group == 0


@pytest.mark.parametrize(("grouping", "name", "index"), [("mst3", "dark", 2), ("mst3", "light", 0),
                                                          ("mst10", "mst10", 9)])
def test_an_mst_group_by_name(grouping, name, index):
    typed = loaded("dataset=synthetic", f"dataset.grouping={grouping}", f"dataset.protected_group={name}")
    assert typed.dataset.protected_group == index


def test_an_unknown_group_name_is_a_config_error_listing_the_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("RESFL_CACHE_DIR", str(tmp_path / "cache"))
    csv = tmp_path / "loans.csv"
    write_loans(csv)
    with pytest.raises(ConfigError, match=r"^dataset\.protected_group: 'Purple' is not a group of this data; its "
                                          r"groups are 0=Asian, 1=Black, 2=White") as err:
        loaded(*csv_keys(csv), "dataset.protected_group=Purple")
    assert err.value.key == "dataset.protected_group"
    with pytest.raises(ConfigError, match=r"^attack\.eod\.unprotected_group: 'whyte' is not a group"):
        loaded(*csv_keys(csv), "attack=privacy", "attack.eod.unprotected_group=whyte")


def test_the_documented_mapping_overrides_compose():
    """docs/own-data.md's `dataset.groups` / `sensitive_bins` overrides compose as written (without the `+`, Hydra
    refuses to add a key to the empty mapping the preset declares) and give the mapping they spell."""
    text = (CONF.parent / "docs" / "own-data.md").read_text()
    shown = re.findall(r"`'?(\+?dataset\.(\w+)=(\{[^`']*\}))'?`", text)
    assert {key for _, key, _ in shown} >= {"groups", "sensitive_bins"}
    for override, key, value in shown:
        cfg = compose_config("dataset=csv", override)
        assert OmegaConf.to_container(cfg.dataset[key]) == yaml.safe_load(value.replace(":", ": ").replace(",", ", "))
