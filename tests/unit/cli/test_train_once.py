"""A plain `resfl train` composes its config once (twice when a tuned file applies) and is otherwise Hydra's run: the
same .hydra/ files and the same config reaching the run as `-r` (Hydra's own path); an Adult run reaches its first
step with one composition and without the detection and optional libraries. Each run is its own process (Hydra
configures logging, the import check needs a fresh interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resfl_lightning.cli.train_once import is_plain

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "YOLO_OFFLINE": "1"}
# Counts Hydra's compositions (compose(), @hydra.main and cli/train_once.py all go through load_configuration).
COUNTED = """
import json, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
composes = []
load = ConfigLoaderImpl.load_configuration
ConfigLoaderImpl.load_configuration = lambda self, *a, **k: composes.append(1) or load(self, *a, **k)
"""
# The run itself replaced by a recorder of the config it gets (nothing is built or trained)
RECORDED = COUNTED + """
from omegaconf import OmegaConf
from resfl_lightning.cli import train
seen = []
train.run = lambda cfg: seen.append(OmegaConf.to_container(cfg))
train.main(sys.argv[1:])
print(json.dumps({"composes": len(composes), "configs": seen}))
"""
# A real run stopped at its first optimizer step: the compositions and the modules imported until then
FIRST_STEP = COUNTED + """
import os
from torch.optim.optimizer import register_optimizer_step_post_hook
from resfl_lightning.cli import train

def first_step(*_):
    print(json.dumps({"composes": len(composes), "modules": sorted(sys.modules)}), flush=True)
    os._exit(0)

register_optimizer_step_post_hook(first_step)
train.main(sys.argv[1:])
"""


def child(code: str, *args: str, timeout: float = 300) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def hydra_files(run_dir: Path) -> dict[str, str]:
    return {f: (run_dir / ".hydra" / f).read_text().replace(str(run_dir), "RUN")
            for f in ("config.yaml", "hydra.yaml", "overrides.yaml")}


def test_plain_means_overrides_only():
    assert is_plain([]) and is_plain(["dataset=adult", "algorithm.beta=-2", "+x.y=1", "hydra.run.dir=out"])
    assert not any(is_plain(a) for a in (["--cfg", "job"], ["-m", "seed=0,1"], ["-r"], ["hydra.mode=MULTIRUN"]))


def test_a_plain_run_composes_once_and_runs_as_hydras_own_run(tmp_path: Path):
    """Untuned: one composition. Tuned (the default run's shipped file): two, and the run gets the tuned config
    while .hydra/ records the user's overrides, exactly what Hydra's `-r` path (three compositions) gives."""
    untuned = child(RECORDED, "use_tuned=false", f"run_dir={tmp_path / 'untuned'}")
    assert untuned["composes"] == 1 and untuned["configs"][0]["tuned_file"] is None
    args = ["dataset=synthetic", "algorithm=resfl", "seed=3"]
    plain = child(RECORDED, *args, f"run_dir={tmp_path / 'plain'}")
    hydra_run = child(RECORDED, "-r", *args, f"run_dir={tmp_path / 'hydra'}")
    assert plain["composes"] == 2 and hydra_run["composes"] > 2
    (config,), (expected,) = plain["configs"], hydra_run["configs"]
    assert config["tuned_file"] == "conf/tuned/synthetic/resfl.yaml" and config["optim"]["lr"] == 0.03
    assert {**config, "run_dir": None} == {**expected, "run_dir": None}
    assert hydra_files(tmp_path / "plain") == hydra_files(tmp_path / "hydra")


def test_a_bad_override_is_one_line_before_anything_is_written(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "resfl_lightning.train", "not_a_key.x=1", f"run_dir={tmp_path / 'r'}"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "config error: Could not override 'not_a_key.x'. To append to your config use +not_a_key.x=1"]
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # a real run up to its first step
def test_an_adult_run_reaches_its_first_step_composed_once_without_detection_libraries(adult_dir: Path,
                                                                                       tmp_path: Path):
    """torchvision and torch._dynamo are not checked: Lightning imports them in every run (its version check imports
    torchmetrics, which imports torchvision; docs/performance.md, "Startup")."""
    out = child(FIRST_STEP, "dataset=adult", f"dataset.root={adult_dir}", "algorithm=fedavg", "use_tuned=false",
                "logger=none", "progress=false", "fabric=cpu", f"run_dir={tmp_path / 'run'}")
    assert out["composes"] == 1
    roots = {m.split(".")[0] for m in out["modules"]}
    assert not roots & {"ultralytics", "opacus", "sklearn", "wandb", "faster_coco_eval"}, sorted(roots)
