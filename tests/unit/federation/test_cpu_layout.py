"""fabric.devices=cores: processes up to the cores and the clients of a node, the rest of the cores as threads."""

from __future__ import annotations

import pytest

from resfl_lightning.federation.cpu_layout import cpu_layout, usable_cores
from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config


@pytest.mark.parametrize(("cores", "clients", "nodes", "expected"), [
    (2, 4, 1, (2, 1)),    # this project's 2-core machine: both cores as processes
    (16, 4, 1, (4, 4)),   # a process owns at least one client; the other cores become threads
    (1, 4, 1, (1, 1)),
    (16, 4, 2, (2, 8)),   # per node: 2 clients each
    (3, 10, 1, (3, 1)),
    (16, 1, 1, (1, 16)),
])
def test_cores_become_processes_up_to_the_clients_then_threads(cores, clients, nodes, expected):
    assert cpu_layout("cores", 1, clients, nodes, cores=cores) == expected


def test_other_values_pass_through_unchanged():
    assert cpu_layout(2, 3, 4, 1, cores=16) == (2, 3)
    assert cpu_layout("auto", 1, 4, 1, cores=16) == ("auto", 1)
    assert usable_cores() >= 1


def test_cores_on_an_accelerator_is_fabrics_auto():
    assert cpu_layout("cores", 4, 8, 1, accelerator="gpu", cores=16) == ("auto", 4)
    for extra in ((), ("fabric=gpu",)):  # `make train ARGS="fabric=gpu"` passes fabric.devices=cores too
        load_config(compose_config("fabric.devices=cores", *extra))
