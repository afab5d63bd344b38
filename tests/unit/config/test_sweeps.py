"""W&B sweep specs render to a trainer command whose Hydra overrides compose into a valid config."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import yaml

from resfl_lightning.run_config.load import load_config
from tests.helpers import compose_config

SWEEPS = sorted((Path(__file__).resolve().parents[3] / "conf" / "sweeps").glob("*.yaml"))


def sample_points(parameters: dict) -> list[dict]:
    """A few parameter assignments the agent could send: grid corners / distribution bounds."""
    choices = {}
    for key, spec in parameters.items():
        if "values" in spec:
            choices[key] = [spec["values"][0], spec["values"][-1]]
        elif "value" in spec:
            choices[key] = [spec["value"]]
        else:
            choices[key] = [spec["min"], spec["max"]]
    return [dict(zip(choices, combo)) for combo in itertools.product(*choices.values())]


def render_agent_command(sweep: dict, point: dict) -> list[str]:
    """What `wandb agent` runs: the command list with its macros expanded (see wandb's agent docs)."""
    args_no_hyphens = [f"{k}={v}" for k, v in point.items()]
    out: list[str] = []
    for token in sweep["command"]:
        if token == "${env}":
            continue
        if token == "${interpreter}":
            out.append(sys.executable)
        elif token == "${program}":
            out.append(sweep["program"])
        elif token == "${args_no_hyphens}":
            out.extend(args_no_hyphens)
        else:
            out.append(token)
    return out


@pytest.mark.parametrize("path", SWEEPS, ids=[p.stem for p in SWEEPS])
def test_sweep_renders_to_a_valid_trainer_config(path: Path):
    sweep = yaml.safe_load(path.read_text())
    assert sweep["method"] in {"grid", "random", "bayes"} and sweep["metric"]["goal"] in {"minimize", "maximize"}
    assert (path.parents[2] / sweep["program"]).is_file()
    for point in sample_points(sweep["parameters"]):
        cmd = render_agent_command(sweep, point)
        assert cmd[1:3] == ["-m", "resfl_lightning.train"], cmd
        cfg = compose_config(*cmd[3:])
        load_config(cfg)
        for key, value in point.items():
            node = cfg
            for part in key.split("."):
                node = node[part]
            assert node == pytest.approx(value), key
        # Each point gets its own run directory, so sweep runs never resume each other.
        assert all(str(v) in cfg.run_name for v in point.values()), cfg.run_name
