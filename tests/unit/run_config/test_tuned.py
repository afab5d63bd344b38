"""conf/tuned/<dataset>/<algorithm>.yaml: applied before the user's overrides (which win key by key), recorded in
tuned_file, off with use_tuned=false, and every shipped file is valid and names evidence that exists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from resfl_lightning.analysis.run_settings import composed_settings
from resfl_lightning.config import ConfigError
from resfl_lightning.resources import conf_dir
from resfl_lightning.run_config.tuned import load_tuned, recorded_path, with_tuned

REPO = Path(__file__).resolve().parents[3]
ADULT_RESFL = "conf/tuned/adult/resfl.yaml"
# A frontier's kind of selection: a config group (adversary=strong) and two keys. The mechanics are tested on a copy
# of conf/ holding this file, not on whatever the shipped tuned files select today (a re-tune changes those).
RESFL_OVERRIDES = ["adversary=strong", "algorithm.lambda_priv=0.3", "optim.lr=0.03"]


@pytest.fixture
def phi_conf(tmp_path, monkeypatch):
    """conf/ copied, with conf/tuned/adult/resfl.yaml = RESFL_OVERRIDES; every reader of the config folder sees it."""
    import shutil

    from resfl_lightning.analysis import run_settings

    conf = tmp_path / "conf"
    shutil.copytree(conf_dir(), conf)
    (conf / "tuned" / "adult").mkdir(parents=True, exist_ok=True)
    (conf / "tuned" / "adult" / "resfl.yaml").write_text(
        yaml.safe_dump({"selected_by": "test", "evidence": [], "overrides": RESFL_OVERRIDES}))
    for module in ("resfl_lightning.analysis.run_settings", "resfl_lightning.run_config.tuned"):
        monkeypatch.setattr(f"{module}.conf_dir", lambda: conf)
    run_settings.clear_composed()
    yield conf
    run_settings.clear_composed()


def _phi(cfg: dict) -> tuple:
    a = cfg["algorithm"]
    return a["lambda_priv"], a["adversary_steps"], a["adversary_lr"]


def test_adult_resfl_gets_its_tuned_adversary_and_the_same_config_as_writing_it_out(phi_conf):
    tuned = composed_settings(["dataset=adult"])
    by_hand = composed_settings(["dataset=adult", "use_tuned=false", *RESFL_OVERRIDES])
    assert tuned["tuned_file"] == ADULT_RESFL and by_hand["tuned_file"] is None
    assert _phi(tuned) == (0.3, 5, 0.01)
    drop = ("tuned_file", "use_tuned")
    assert {k: v for k, v in tuned.items() if k not in drop} == {k: v for k, v in by_hand.items() if k not in drop}


def test_the_users_own_overrides_win_key_by_key(phi_conf):
    assert _phi(composed_settings(["dataset=adult", "adversary=paper_minimal"])) == (0.3, 1, 0.001)
    assert _phi(composed_settings(["dataset=adult", "algorithm.lambda_priv=0.1"])) == (0.1, 5, 0.01)
    mine = ["adversary=paper_minimal", "algorithm.lambda_priv=0.1",
            *(o for o in RESFL_OVERRIDES if not o.startswith(("adversary=", "algorithm.lambda_priv=")))]
    both = composed_settings(["dataset=adult", *mine])
    assert both["tuned_file"] is None and _phi(both) == (0.1, 1, 0.001)  # nothing left to apply


@pytest.mark.parametrize("overrides", [["dataset=adult", "use_tuned=false"], ["dataset=synthetic", "use_tuned=false"],
                                       ["dataset=synthetic", "algorithm=curvfed"], ["dataset=csv"]])
def test_no_tuned_file_applies(overrides):
    cfg = composed_settings(overrides)
    assert cfg["tuned_file"] is None
    assert cfg["algorithm"]["adversary_steps"] == 1  # the paper-minimal phi


def test_the_default_run_gets_the_synthetic_tune():
    """`make train` (synthetic, resfl): the synthetic tune's selection (docs/results/tune-synthetic-group_skew.md)."""
    cfg = composed_settings(["dataset=synthetic"])
    assert cfg["tuned_file"] == "conf/tuned/synthetic/resfl.yaml"
    assert cfg["optim"]["lr"] == 0.03
    assert composed_settings(["dataset=synthetic", "use_tuned=false"])["optim"]["lr"] == 0.01


def test_an_adult_scenario_selecting_the_dataset_gets_the_adult_file(phi_conf):
    assert composed_settings(["scenario=adult_occupation"])["tuned_file"] == ADULT_RESFL


def test_with_tuned_puts_the_file_first_and_records_it(tmp_path):
    path = tmp_path / "tuned" / "d" / "m.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"selected_by": "x", "evidence": [], "overrides": ["a.b=1", "c=2"]}))
    out, tuned, applied = with_tuned(["c=3", "e=4"], {"dataset": "d", "algorithm": "m"}, root=tmp_path)
    assert out == ["a.b=1", "c=3", "e=4", f"tuned_file={tmp_path.name}/tuned/d/m.yaml"]
    assert applied == ["a.b=1"] and tuned.path == path
    assert with_tuned(["c=3"], {"dataset": "d", "algorithm": "other"}, root=tmp_path)[1] is None
    assert with_tuned(["use_tuned=false"], {"dataset": "d", "algorithm": "m"}, root=tmp_path)[1] is None
    with pytest.raises(ConfigError, match="use_tuned: true or false"):
        with_tuned(["use_tuned=maybe"], {"dataset": "d", "algorithm": "m"}, root=tmp_path)
    with pytest.raises(ConfigError, match="tuned_file: records"):
        with_tuned(["tuned_file=x"], {"dataset": "d", "algorithm": "m"}, root=tmp_path)


def test_the_recorded_path_is_the_same_from_a_checkout_and_from_an_installed_package(tmp_path):
    # A checkout keeps conf/ beside the package, a wheel inside it; runs and `resfl tune` record conf/... in both
    # (tune once recorded resfl_lightning/conf/... from a wheel, so its bases never matched the runs' record).
    for conf in (tmp_path / "repo" / "conf", tmp_path / "site" / "resfl_lightning" / "conf"):
        path = conf / "tuned" / "adult" / "resfl.yaml"
        assert recorded_path(path, root=conf) == "conf/tuned/adult/resfl.yaml"
    assert recorded_path(REPO / ADULT_RESFL) == ADULT_RESFL
    assert recorded_path(tmp_path / "elsewhere.yaml") == str(tmp_path / "elsewhere.yaml")


@pytest.mark.parametrize("content, match", [
    ("overrides: [a=1]\n", "missing keys"),
    ("selected_by: x\nevidence: []\noverrides: [a=1]\nextra: 1\n", "unknown keys"),
    ("selected_by: x\nevidence: []\noverrides: [justakey]\n", r"overrides\[0\]"),
    ("selected_by: x\nevidence: []\noverrides: [use_tuned=false]\n", r"overrides\[0\]"),
    ("selected_by: x\nevidence: []\noverrides: []\n", "non-empty list"),
    ("- a\n", "expected a mapping"),
])
def test_a_bad_tuned_file_is_an_error_naming_it(tmp_path, content, match):
    path = tmp_path / "m.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match) as err:
        load_tuned(path)
    assert str(path) in str(err.value)


def test_every_shipped_tuned_file_is_valid_and_names_existing_evidence():
    from resfl_lightning.analysis.table import table_preset

    files = sorted((conf_dir() / "tuned").glob("*/*.yaml"))
    assert files, "conf/tuned/ holds no tuned file"
    datasets = sorted(p.stem for p in (conf_dir() / "dataset").glob("*.yaml"))
    for path in files:
        tuned = load_tuned(path)
        scope = path.parent.name  # a dataset, or the experiment preset a dataset's tables run (its own tune)
        scoped = ([f"dataset={scope}"] if scope in datasets else
                  [[f"dataset={d}", f"experiment={scope}"] for d in datasets
                   if table_preset(d) == [f"experiment={scope}"]][0])
        assert (conf_dir() / "algorithm" / f"{path.stem}.yaml").is_file(), path
        for doc in yaml.safe_load(path.read_text())["evidence"]:
            assert (REPO / doc).is_file(), f"{path}: evidence {doc} does not exist"
        assert composed_settings([*scoped, f"algorithm={path.stem}"])["tuned_file"] == (
            f"conf/tuned/{scope}/{path.stem}.yaml"), path
        assert tuned.overrides


def test_the_train_app_recomposes_with_the_tuned_file(capsys, phi_conf):
    """cli/train.py apply_tuned, inside a Hydra app context: the config the run builds from is the tuned one."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from resfl_lightning.cli.train import apply_tuned

    with initialize_config_dir(config_dir=str(phi_conf), version_base="1.3"):
        full = compose(config_name="train", overrides=["dataset=adult"], return_hydra_config=True)
        HydraConfig.instance().set_config(full)
        plain = compose(config_name="train", overrides=["dataset=adult"])
        cfg = apply_tuned(plain)
    assert cfg is not plain and OmegaConf.select(cfg, "tuned_file") == ADULT_RESFL
    assert (cfg.algorithm.lambda_priv, cfg.algorithm.adversary_steps) == (0.3, 5)
    assert f"tuned: {ADULT_RESFL} applied ({' '.join(RESFL_OVERRIDES)})" in capsys.readouterr().out


def test_cfg_job_prints_the_tuned_config():
    """`resfl train --cfg job` prints without running the app: it must still show what a run would train with."""
    import os
    import subprocess
    import sys

    def printed(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "resfl_lightning.train", *args, "--cfg", "job"], cwd=REPO,
                              capture_output=True, text=True, timeout=120, env={**os.environ, "YOLO_OFFLINE": "1"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    # the shipped synthetic file (the default run's; test_the_default_run_gets_the_synthetic_tune): lr x 3
    tuned = OmegaConf.create(printed("dataset=synthetic"))
    assert tuned.tuned_file == "conf/tuned/synthetic/resfl.yaml" and tuned.optim.lr == 0.03
    plain = OmegaConf.create(printed("dataset=synthetic", "use_tuned=false"))
    assert plain.tuned_file is None and plain.optim.lr == 0.01


def test_an_experiment_preset_with_its_own_folder_reads_only_that_folder(tmp_path: Path):
    """conf/tuned/<experiment>/ when it exists (even empty: the preset is not tuned yet), else conf/tuned/<dataset>/."""
    from resfl_lightning.run_config.tuned import tuned_folder

    (tmp_path / "tuned" / "d").mkdir(parents=True)
    (tmp_path / "tuned" / "d" / "m.yaml").write_text("selected_by: x\nevidence: [e.md]\noverrides: [a.b=1]\n")
    choices = {"dataset": "d", "algorithm": "m"}
    assert with_tuned([], {**choices, "experiment": "other"}, root=tmp_path)[1].path == tmp_path / "tuned/d/m.yaml"
    (tmp_path / "tuned" / "own").mkdir()
    assert tuned_folder("d", "own", tmp_path / "tuned") == tmp_path / "tuned" / "own"
    assert with_tuned([], {**choices, "experiment": "own"}, root=tmp_path)[1] is None  # not the dataset's values
    (tmp_path / "tuned" / "own" / "m.yaml").write_text("selected_by: y\nevidence: [f.md]\noverrides: [a.b=2]\n")
    out, tuned, _ = with_tuned([], {**choices, "experiment": "own"}, root=tmp_path)
    assert tuned.path == tmp_path / "tuned/own/m.yaml" and out[0] == "a.b=2"


def test_the_calibrated_detection_preset_reads_its_own_tune_and_the_first_keeps_its_tune():
    """experiment=table_synthetic reads its own folder (conf/tuned/table_synthetic/, its tune's selections), never the
    first preset's; the first preset keeps the synthetic tune. (An empty own folder: the test above.)"""
    calibrated = composed_settings(["dataset=synthetic", "experiment=table_synthetic"])
    own = load_tuned(conf_dir() / "tuned" / "table_synthetic" / "resfl.yaml")
    assert calibrated["tuned_file"] == "conf/tuned/table_synthetic/resfl.yaml"
    assert f"optim.lr={calibrated['optim']['lr']}" in own.overrides
    first = composed_settings(["dataset=synthetic", "experiment=table_synthetic_v1"])
    assert first["tuned_file"] == "conf/tuned/synthetic/resfl.yaml" and first["optim"]["lr"] == 0.03
