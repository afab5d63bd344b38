"""Hydra composition: `dataset=adult` selects the tabular model and its recipe; builders make a TabularClient."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from resfl_lightning.builders import build_client, federation_settings
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.data.datasets.adult import AdultDataset, expected_num_features
from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config

torch.set_num_threads(1)


def test_dataset_adult_selects_the_tabular_model_and_recipe():
    cfg = load_config(compose_config("dataset=adult", "dataset.root=/data/adult"))
    assert cfg.model.name == "tabular" and list(cfg.model.hidden) == [256, 128, 64]
    assert cfg.dataset.name == "adult" and cfg.dataset.task == "classification"
    assert isinstance(OmegaConf.to_object(cfg.dataset), AdultDataset)
    assert cfg.dataset.num_features == expected_num_features(cfg.dataset) == 105
    assert cfg.optim.lr == pytest.approx(0.01) and cfg.federation.rounds == 10
    settings = federation_settings(cfg)
    assert settings.lr_milestones == () and settings.lr_factor(9) == 1.0
    data = SimpleNamespace(num_groups=5, num_classes=2, num_features=105)
    client = build_client(cfg, data)
    assert isinstance(client, TabularClient) and client.model.body[0].in_features == 105
    assert client.model.hidden == (256, 128, 64) and client.adversary.num_groups == 5


def test_explicit_model_choice_wins_and_other_datasets_keep_yolo():
    assert compose_config("dataset=adult", "model=yolov8").model.name == "yolov8"
    assert compose_config().model.name == "yolov8"
    assert compose_config("dataset=adult", "model.hidden=[32,16]").model.hidden == [32, 16]


def test_adult_experiment():
    cfg = compose_config("experiment=adult", "algorithm=fedavg", "federation.rounds=3")
    assert cfg.dataset.name == "adult" and cfg.model.name == "tabular" and cfg.algorithm.name == "fedavg"
    assert cfg.eval.every == 1 and cfg.federation.rounds == 3 and cfg.optim.lr == pytest.approx(0.01)
