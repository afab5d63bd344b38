"""Hydra composition: `dataset=adult` selects the tabular model; the experiment recipe; builders make a TabularClient."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from resfl_lightning.builders import build_client
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.config import validate_config
from resfl_lightning.data.tabular import expected_num_features

torch.set_num_threads(1)
CONF = str(Path(__file__).resolve().parents[1] / "conf")


def composed(*overrides: str):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("train", overrides=list(overrides))


def test_dataset_adult_selects_the_tabular_model():
    cfg = composed("dataset=adult", "dataset.root=/data/adult")
    assert cfg.model.name == "tabular" and list(cfg.model.hidden) == [256, 128, 64]
    assert cfg.dataset.name == "adult" and cfg.dataset.task == "classification"
    assert cfg.dataset.num_features == expected_num_features(cfg.dataset) == 105
    validate_config(cfg)
    client = build_client(cfg, num_groups=5, num_classes=2)
    assert isinstance(client, TabularClient) and client.model.body[0].in_features == 105
    assert client.model.hidden == (256, 128, 64) and client.adversary.num_groups == 5


def test_explicit_model_choice_wins_and_other_datasets_keep_yolo():
    assert composed("dataset=adult", "model=yolov8").model.name == "yolov8"
    assert composed().model.name == "yolov8"
    assert composed("dataset=adult", "model.hidden=[32,16]").model.hidden == [32, 16]


def test_adult_experiment_recipe():
    cfg = composed("experiment=adult", "algorithm=fedavg")
    assert cfg.dataset.name == "adult" and cfg.model.name == "tabular"
    assert cfg.optim.lr == pytest.approx(0.01) and cfg.federation.rounds == 10 and cfg.algorithm.name == "fedavg"
    assert composed("experiment=adult", "federation.rounds=3").federation.rounds == 3
