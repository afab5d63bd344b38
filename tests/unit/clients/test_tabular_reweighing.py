"""Kamiran–Calders reweighing in the tabular client's task loss (algorithm.local_reweighting): the weighted loss by
hand, the default unchanged, the builder's weights, DP-SGD's per-example gradients, the detection refusal."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from resfl_lightning.builders import build_client
from resfl_lightning.config import ConfigError
from resfl_lightning.data.reweighing import split_row_weights
from resfl_lightning.losses.evidential import dirichlet_nll
from resfl_lightning.models.tabular import TabularNet
from resfl_lightning.privacy import bookkeeping
from resfl_lightning.privacy.dp import DPSettings, prepare_model
from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config
from tests.unit.clients.test_tabular_client import NUM_FEATURES, make_client, toy_data
from tests.unit.privacy.test_dp_sgd import dp_of, dp_tabular_client, per_example_grads

torch.set_num_threads(1)


def client_weights(data) -> torch.Tensor:
    return split_row_weights(data.groups, data.y, [c.train for c in data.splits.clients])


def test_weighted_task_loss_is_the_hand_computed_weighted_mean():
    data = toy_data()
    batch = next(iter(data.train_loader(0, seed=0)))
    client = make_client(lambda_priv=0.0, lambda_fair=0.0)
    client.row_weights = client_weights(data)
    client.train()
    loss = client.training_step(batch, 0).detach()
    with torch.no_grad():  # train mode: the same batch statistics as the step's forward
        alpha = client.model(batch["x"]).alpha
        nll = dirichlet_nll(alpha, F.one_hot(batch["y"], 2).to(alpha.dtype))
    w = client.row_weights[batch["index"]]
    assert not torch.allclose(w, torch.ones_like(w))  # the toy labels depend on the group
    expected = sum(float(wi) * float(li) for wi, li in zip(w, nll)) / len(nll)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert float(loss) != pytest.approx(float(nll.mean()), rel=1e-3)


def test_unit_weights_give_the_unweighted_loss_bitwise():
    data = toy_data()
    batch = next(iter(data.train_loader(0, seed=0)))
    plain, ones = make_client(lambda_priv=0.0), make_client(lambda_priv=0.0)
    ones.row_weights = torch.ones(len(data.y))
    plain.train(), ones.train()
    assert torch.equal(plain.training_step(batch, 0), ones.training_step(batch, 0))


def test_the_builder_gives_the_clients_weights_only_when_the_key_is_on():
    data = toy_data()
    off = build_client(compose_config("algorithm=fairfed", "dataset=adult", "logger=none"), data)
    assert off.row_weights is None
    on = build_client(compose_config("algorithm=fairfed", "dataset=adult", "logger=none",
                                     "algorithm.local_reweighting=true"), data)
    torch.testing.assert_close(on.row_weights, client_weights(data))
    for c in data.splits.clients:
        assert float(on.row_weights[torch.as_tensor(c.train)].sum()) == pytest.approx(len(c.train), rel=1e-5)


def test_dp_sgd_per_example_gradients_are_the_weighted_ones():
    """opacus' per-example gradients of the weighted mean are w_i times the unweighted per-example gradients (from a
    hook-free copy of the model)."""
    client = dp_tabular_client(DPSettings(target_epsilon=None, noise_multiplier=0.0, max_grad_norm=1.0))
    reference = prepare_model(TabularNet(NUM_FEATURES, (16, 8)))
    reference.load_state_dict(client.model.state_dict())
    data = toy_data(batch_size=16)
    client.row_weights = client_weights(data)
    optimizer = client.configure_optimizers()
    dp_of(client).loader(data.train_loader(0, seed=0))
    batch = next(iter(data.train_loader(0, seed=1)))
    grads = per_example_grads(reference, batch["x"], batch["y"])
    client.train()
    optimizer.zero_grad(set_to_none=True)
    client.training_step(batch, 0).backward()
    hooks = torch.cat([bookkeeping.dense(p.grad_sample).reshape(len(grads), -1) for p in client.model.parameters()],
                      dim=1)
    w = client.row_weights[batch["index"]].unsqueeze(1)
    torch.testing.assert_close(hooks, w * torch.stack(grads), rtol=1e-4, atol=1e-6)


def test_detection_datasets_refuse_the_key_before_anything_is_built():
    with pytest.raises(ConfigError, match=r"algorithm\.local_reweighting: .*need a label y per sample"):
        load_config(compose_config("algorithm=fairfed", "algorithm.local_reweighting=true"))
    load_config(compose_config("algorithm=fairfed", "dataset=adult", "algorithm.local_reweighting=true"))
