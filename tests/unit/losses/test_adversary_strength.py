"""phi's strength settings (docs/method.md §2): inner steps, depth, warm-up, the GRL schedule, kept or re-initialised
phi, and the conf/adversary/ presets."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from resfl_lightning.algorithms.base import Algorithm
from resfl_lightning.builders import algorithm_of
from resfl_lightning.clients.base import AdversarySettings, LossWeights, OptimSettings, UfmSettings
from resfl_lightning.clients.tabular import TabularClient
from resfl_lightning.config.errors import ConfigError
from resfl_lightning.federation.local import local_train
from resfl_lightning.losses.adversary import Adversary
from resfl_lightning.losses.grl import dann_coefficient
from resfl_lightning.resources import conf_dir
from resfl_lightning.run_config.load import load_config

torch.set_num_threads(1)
FEATURES, GROUPS = 6, 3


def make_client(lambda_priv: float = 0.5, **adversary) -> TabularClient:
    torch.manual_seed(0)
    return TabularClient(FEATURES, GROUPS, LossWeights(lambda_priv=lambda_priv, lambda_fair=0.0), UfmSettings(),
                         OptimSettings(lr=0.05, weight_decay=0.0), hidden=(16, 8),
                         adversary=AdversarySettings(**adversary))


def batches(n: int, size: int = 8, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(size, FEATURES, generator=g), "y": torch.randint(0, 2, (size,), generator=g),
             "groups": torch.randint(0, GROUPS, (size,), generator=g), "index": torch.arange(size)}
            for _ in range(n)]


def phi_params(client: TabularClient) -> list[torch.Tensor]:
    return [p.detach().clone() for p in client.adversary.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("steps", [1, 3])
def test_inner_steps_take_k_phi_optimiser_steps_per_encoder_step(steps):
    client = make_client(steps=steps)
    counts = {"theta": 0, "phi": 0}
    make_theta, make_phi = client.configure_optimizers, client.local_optimizers

    def counted(opts, key):
        for opt in opts:
            opt.register_step_post_hook(lambda *_: counts.__setitem__(key, counts[key] + 1))
        return opts

    client.configure_optimizers = lambda: counted([make_theta()], "theta")[0]
    client.local_optimizers = lambda: counted(make_phi(), "phi")
    client.begin_client(0, 0)
    data = batches(5)
    local_train(L.Fabric(accelerator="cpu", devices=1), client, lambda epoch: data, epochs=2)
    assert counts["theta"] == 10
    assert counts["phi"] == steps * 10


def test_dann_ramp_matches_its_formula():
    # 2 / (1 + exp(-x)) - 1 = tanh(x / 2): an independent form of the same ramp
    for p in (0.0, 0.05, 0.25, 0.5, 0.9, 1.0):
        assert dann_coefficient(p) == pytest.approx(np.tanh(10.0 * p / 2), abs=1e-12)
        assert dann_coefficient(p, gamma=3.0) == pytest.approx(2 / (1 + np.exp(-3.0 * p)) - 1, abs=1e-12)
    assert dann_coefficient(0.0) == 0.0 and dann_coefficient(1.0) == pytest.approx(0.9999092, abs=1e-7)
    with pytest.raises(ValueError, match="progress"):
        dann_coefficient(1.5)


def test_dann_schedule_scales_the_reversal_by_the_ramp_of_rounds_x_local_steps():
    client = make_client(lambda_priv=0.5, schedule="dann", rounds=4)
    client.begin_client(0, 1)
    client.begin_epoch(1, 2, 10)
    # round 1 of 4, second of 2 epochs, batch 5 of 10: p = (1 + (1 + 5/10) / 2) / 4 = 0.4375
    assert client.reversal_coefficient(5) == pytest.approx(0.5 * np.tanh(5 * 0.4375), abs=1e-12)
    client.begin_client(0, 0)
    assert client.reversal_coefficient(0) == 0.0  # the ramp starts at 0
    constant = make_client(lambda_priv=0.5)
    constant.begin_client(0, 1)
    assert constant.reversal_coefficient(5) == 0.5
    with pytest.raises(ValueError, match="rounds"):
        AdversarySettings(schedule="dann")


def test_dann_schedule_reaches_the_grl_during_local_training():
    client = make_client(lambda_priv=0.5, schedule="dann", rounds=2)
    seen = []
    client.adversary.grl.register_forward_pre_hook(lambda module, args: seen.append(module.scale))
    client.begin_client(0, 1)
    data = batches(4)
    local_train(L.Fabric(accelerator="cpu", devices=1), client, lambda epoch: data, epochs=1)
    expected = [0.5 * np.tanh(5 * (1 + b / 4) / 2) for b in range(4)]
    assert seen == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_depth_builds_that_many_hidden_layers(depth):
    adv = Adversary(in_dim=10, num_groups=4, hidden=7, depth=depth)
    linears = [m for m in adv.mlp if isinstance(m, torch.nn.Linear)]
    assert len(linears) == depth + 1
    assert [(m.in_features, m.out_features) for m in linears] == \
        [(10, 7)] * min(depth, 1) + [(7, 7)] * max(depth - 1, 0) + [(7 if depth else 10, 4)]
    assert sum(isinstance(m, torch.nn.ReLU) for m in adv.mlp) == depth
    assert adv(torch.randn(3, 10)).shape == (3, 4)


def test_depth_one_is_the_previous_architecture_with_the_same_initial_weights():
    torch.manual_seed(3)
    old = torch.nn.Sequential(torch.nn.Linear(10, 7), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(7, 4))
    torch.manual_seed(3)
    new = Adversary(in_dim=10, num_groups=4, hidden=7)
    assert list(new.mlp.state_dict()) == list(old.state_dict())
    assert same(list(new.mlp.state_dict().values()), list(old.state_dict().values()))


def test_depth_reaches_the_client_from_the_config():
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["algorithm.adversary_depth=3", "federation.rounds=2"])
    algorithm = algorithm_of(load_config(cfg))
    assert algorithm.adversary(2).depth == 3
    client = TabularClient(FEATURES, GROUPS, LossWeights(), UfmSettings(), OptimSettings(),
                           adversary=algorithm.adversary(2))
    assert sum(isinstance(m, torch.nn.Linear) for m in client.adversary.mlp) == 4


def test_reinit_gives_phi_fresh_parameters_each_round_and_keep_does_not():
    kept, fresh = make_client(), make_client(reinit=True)
    for client in (kept, fresh):
        client.import_local_state(None, seed=11)
    state = {k: v + 0.25 for k, v in kept.export_local_state().items() if k.startswith("adversary.")}
    state["ufm.ema"] = torch.tensor(float("nan"), dtype=torch.float64)
    saved = [state[f"adversary.{k}"] for k, _ in kept.adversary.named_parameters()]

    starts = {}
    for name, client in (("keep", kept), ("reinit", fresh)):
        for r in (1, 2):
            client.import_local_state(state, seed=11)  # the client's phi as trained up to round r - 1
            client.begin_client(0, r)
            starts[name, r] = phi_params(client)
    torch.manual_seed(0)
    a = torch.rand(1)
    torch.manual_seed(0)
    fresh.import_local_state(state, seed=11)
    fresh.begin_client(0, 1)
    assert torch.equal(torch.rand(1), a)  # the re-draw leaves the global RNG where it was
    assert same(starts["keep", 1], saved) and same(starts["keep", 2], saved)
    assert not any(torch.equal(x, y) for x, y in zip(starts["reinit", 1], saved))
    assert not any(torch.equal(x, y) for x, y in zip(starts["reinit", 1], starts["reinit", 2]))
    fresh.import_local_state(state, seed=11)
    fresh.begin_client(0, 2)
    assert same(phi_params(fresh), starts["reinit", 2])  # a function of (client seed, round) alone


def test_warmup_reverses_no_gradient_into_the_encoder_while_phi_still_learns():
    client = make_client(lambda_priv=0.5, warmup_rounds=2)
    client.adversary.eval()  # no dropout: the reference below sees the same phi
    h = torch.randn(12, client.model.feature_dim)
    groups = torch.arange(12) % GROUPS
    grads = {}
    for r in (0, 1, 2):
        client.begin_client(0, r)
        client.adversary.zero_grad()
        feats = h.clone().requires_grad_(True)
        client.adversary_loss(feats, groups, 0).backward()
        grads[r] = feats.grad.clone()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in client.adversary.parameters())
    assert torch.count_nonzero(grads[0]) == 0 and torch.count_nonzero(grads[1]) == 0
    feats = h.clone().requires_grad_(True)
    F.cross_entropy(client.adversary.mlp(feats), groups).backward()  # phi without the GRL
    assert torch.allclose(grads[2], -0.5 * feats.grad, atol=1e-7)


def compose_algorithm(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides))
    return {k: v for k, v in cfg.algorithm.items() if k.startswith("adversary_")}


def test_presets_paper_minimal_is_the_schema_default_and_strong_is_issue_28s_setting():
    defaults = {f.name: f.default for f in Algorithm.__dataclass_fields__.values() if f.name.startswith("adversary_")}
    assert compose_algorithm() == defaults == compose_algorithm("adversary=paper_minimal")
    assert compose_algorithm("algorithm=fedavg") == defaults
    strong = compose_algorithm("adversary=strong")
    assert strong == {**defaults, "adversary_steps": 5, "adversary_lr": 0.01}
    assert compose_algorithm("adversary=strong", "algorithm.adversary_steps=3")["adversary_steps"] == 3


@pytest.mark.parametrize(("key", "value"), [("adversary_depth", -1), ("adversary_warmup_rounds", -2),
                                            ("adversary_schedule", "ramp"), ("adversary_dann_gamma", 0.0)])
def test_bad_strength_settings_name_their_key(key, value):
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"algorithm.{key}={value}"])
    with pytest.raises(ConfigError, match=rf"^algorithm\.{key}:"):
        load_config(cfg)
