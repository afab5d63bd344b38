"""Host-to-device batch transfers (GPU readiness, docs/performance.md): dataset.loader.pin_memory=auto pins batches only
when the run's device is CUDA, and every batch copy to a CUDA device is non-blocking (no GPU needed: the device is faked
and the copies recorded)."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from resfl_lightning.config.errors import ConfigError
from resfl_lightning.config.sections import LoaderSettings, Recipe
from resfl_lightning.data.federated import build_federated_data
from resfl_lightning.federation.local import local_train
from tests.federation_helpers import client_factory, tiny_data
from tests.plugins import GaussianRows


@pytest.mark.parametrize(("device_type", "pinned"), [("cuda", True), ("cpu", False), ("mps", False),
                                                     ("xpu", False)])
def test_auto_pins_memory_only_for_a_cuda_device(device_type, pinned):
    auto = LoaderSettings()
    assert auto.pin_memory == "auto" and auto.kwargs()["pin_memory"] is False  # unresolved: nothing pinned
    assert auto.resolved(device_type).kwargs()["pin_memory"] is pinned
    for explicit in (True, False):  # an explicit choice wins on every device
        assert LoaderSettings(pin_memory=explicit).resolved(device_type).kwargs()["pin_memory"] is explicit


def test_pin_memory_accepts_only_true_false_or_auto():
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="dataset.loader.pin_memory"):
            LoaderSettings(pin_memory=bad)


def test_the_run_device_resolves_the_loaders_of_the_built_data():
    ds = GaussianRows(_target_="tests.plugins.GaussianRows", name="rows", gate_mode="absolute", num_clients=2,
                      test_fraction=0.0, recipe=Recipe(rounds=1, local_epochs=1, lr=0.1))
    for device_type, pinned in (("cuda", True), ("cpu", False), (None, False)):
        data = build_federated_data(ds, seed=0, printer=lambda *_: None, device_type=device_type)
        assert data.train_loader(0, seed=0).pin_memory is pinned and data.test_loader().pin_memory is pinned
    assert ds.loader.pin_memory == "auto"  # the config object itself is left as written


def test_a_saved_config_from_before_auto_is_not_a_stale_run(tmp_path):
    """Runs saved with the old default (pin_memory: false) still match what the same command composes now."""
    from omegaconf import OmegaConf

    from resfl_lightning.analysis.run_settings import composed_settings, finished_run_mismatch

    overrides = ["dataset=adult", "logger=none", "federation.rounds=2"]
    saved = composed_settings(overrides)
    assert saved["dataset"]["loader"]["pin_memory"] == "auto"
    saved["dataset"]["loader"]["pin_memory"] = False
    saved["federation"]["rounds"] = 3
    OmegaConf.save(OmegaConf.create(saved), tmp_path / "config.yaml")
    assert finished_run_mismatch(tmp_path, overrides) == ["federation.rounds: 3 -> 2"]


def test_batches_reach_a_cuda_device_with_non_blocking_copies(monkeypatch):
    """The local loop's batches (fabric.to_device) and the evaluation's (FederatedClient.place) are copied with
    non_blocking=True to a CUDA device, and blocking to the CPU (a CPU run is unchanged)."""
    copies = []
    original = torch.Tensor.to

    def recording_to(self, *args, **kwargs):
        target = args[0] if args else kwargs.get("device")
        if isinstance(target, torch.device):  # a device move: record it and stay on the CPU
            copies.append((target.type, kwargs.get("non_blocking", False)))
            return self
        return original(self, *args, **kwargs)

    data = tiny_data(1)
    batches = list(data.train_loader(0, seed=0))
    for device in (torch.device("cuda", 0), torch.device("cpu")):
        fabric = L.Fabric(accelerator="cpu", devices=1)
        client = client_factory()
        client.fabric = fabric
        client.begin_client(0, 0)
        copies.clear()
        with monkeypatch.context() as patch:
            patch.setattr(L.Fabric, "device", property(lambda self, d=device: d))
            patch.setattr(torch.Tensor, "to", recording_to)
            local_train(fabric, client, lambda epoch: batches, epochs=1)
            client.place(batches[0])
        if device.type == "cuda":  # every tensor of every batch, then the evaluated one
            assert [c for c in copies if c[0] == "cuda"] == [("cuda", True)] * ((len(batches) + 1) * len(batches[0]))
        else:  # the same calls (and on-device no-op moves) without non_blocking
            assert copies and not any(non_blocking for _, non_blocking in copies)
