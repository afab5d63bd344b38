"""The GroupNorm rule of DP models (privacy/groupnorm.py): group counts, opacus' old layout kept as `opacus`, the
BatchNorm1d case, and `algorithm.dp.enabled=false` (the GroupNorm model without DP-SGD)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from opacus.validators import ModuleValidator
from torch import nn

from resfl_lightning.builders import build_client
from resfl_lightning.privacy.dp import prepare_model
from resfl_lightning.privacy.groupnorm import groupnorm_groups
from tests.helpers import compose_config
from tests.unit.privacy.test_dp_sgd import dp_of


@pytest.mark.parametrize(("channels", "groups"), [
    (1, 1), (2, 1), (3, 1), (4, 1), (8, 2), (16, 4), (20, 5), (24, 6), (30, 6), (32, 8), (48, 12), (64, 16),
    (80, 20), (96, 24), (128, 32), (256, 32), (384, 32), (100, 25), (7, 1), (36, 9), (200, 25)])
def test_min32_c4_is_the_largest_divisor_up_to_min_32_and_a_quarter_of_c(channels, groups):
    g = groupnorm_groups(channels, "min32_c4")
    assert g == groups
    assert channels % g == 0 and g <= 32
    assert channels < 4 or channels // g >= 4  # never fewer than 4 channels per group where C allows it


@pytest.mark.parametrize("channels", [4, 16, 32, 48, 64, 256])
def test_opacus_rule_is_opacus_fix(channels):
    fixed = ModuleValidator.fix(nn.Sequential(nn.BatchNorm2d(channels)))
    assert groupnorm_groups(channels, "opacus") == fixed[0].num_groups == math.gcd(32, channels)


def test_unknown_rule_and_bad_channels_are_named():
    with pytest.raises(ValueError, match="algorithm.dp.groupnorm_groups"):
        groupnorm_groups(16, "gn32")
    with pytest.raises(ValueError, match="channels >= 1"):
        groupnorm_groups(0)


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.Conv2d(16, 64, 3),
                         nn.BatchNorm2d(64), nn.Flatten(), nn.Linear(64, 8),
                         nn.BatchNorm1d(8, eps=1e-3))


def layout(model: nn.Module) -> list[tuple[int, int, float]]:
    return [(m.num_groups, m.num_channels, m.eps) for m in model.modules() if isinstance(m, nn.GroupNorm)]


def test_prepare_model_applies_the_rule_and_keeps_the_opacus_layout_on_request():
    new, old = prepare_model(conv_net(), "min32_c4"), prepare_model(conv_net(), "opacus")
    assert layout(new) == [(4, 16, 1e-5), (16, 64, 1e-5), (1, 8, 1e-3)]
    assert layout(old) == [(16, 16, 1e-5), (32, 64, 1e-5), (1, 8, 1e-3)]  # opacus' gcd(32, C); BatchNorm1d as before
    for model in (new, old):
        assert ModuleValidator.validate(model, strict=False) == []
        assert not any(getattr(m, "inplace", False) for m in model.modules())
    # Only the normalisation layers differ: the other weights are the original model's.
    for (k, a), (_, b) in zip(new.state_dict().items(), old.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


def test_dp_disabled_keeps_the_groupnorm_model_without_dp_sgd():
    """`algorithm.dp.enabled=false`: the DP model's GroupNorm layout, trained without clipping, noise or accounting."""
    data = SimpleNamespace(num_groups=3, num_classes=1)
    on = build_client(compose_config("algorithm=fedavg_dp", "model.scale=femto", "logger=none"), data)
    off = build_client(compose_config("algorithm=fedavg_dp", "algorithm.dp.enabled=false", "model.scale=femto",
                                      "logger=none"), data)
    assert dp_of(on) is not None and dp_of(off) is None
    assert layout(on.model) == layout(off.model) and layout(off.model)
    assert not isinstance(off.configure_optimizers(), type(on.configure_optimizers()))
    assert off.report_extras(None) == {}  # no DP numbers to report
