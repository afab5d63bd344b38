"""The distribution is self-contained: only `resfl_lightning` at the top level, configs as package data, and a wheel
installed into a fresh virtual environment trains from a directory outside the checkout."""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from resfl_lightning.resources import conf_dir

tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11 reads pyproject.toml with tomllib")
REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
# Not config groups: table (the columns), tune (`resfl tune`'s grids), tuned (applied by run_config/tuned.py)
NOT_GROUPS = ("hydra", "sweeps", "table", "tune", "tuned")


def source_packages() -> set[str]:
    """Dotted names of every package in the checkout as it is installed (callbacks/ -> resfl_lightning.callbacks)."""
    names = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "resfl_lightning").rglob("__init__.py")}
    names |= {"resfl_lightning." + ".".join(p.parent.relative_to(REPO).parts)
              for p in (REPO / "callbacks").rglob("__init__.py")}
    return {n for n in names if "__pycache__" not in n}


def test_every_package_is_listed_and_only_resfl_lightning_is_top_level():
    listed = set(SETUPTOOLS["packages"])
    missing = source_packages() - listed
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"
    assert {p.split(".")[0] for p in listed} == {"resfl_lightning"}
    assert SETUPTOOLS["package-dir"] == {"resfl_lightning.callbacks": "callbacks", "resfl_lightning.conf": "conf"}


def test_no_code_imports_the_top_level_callbacks_folder_or_finds_conf_by_path():
    """`callbacks` is not installed as a top-level name, and an installed package has no ../conf."""
    bad = []
    for path in [*REPO.glob("resfl_lightning/**/*.py"), *REPO.glob("callbacks/**/*.py"), *REPO.glob("tests/*.py")]:
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if re.match(r"\s*(from|import)\s+callbacks\b", line):
                bad.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
            if path.parent.name != "tests" and re.search(r"parents\[1\]\s*/\s*[\"']conf", line):
                bad.append(f"{path.relative_to(REPO)}:{n}: finds conf/ by path; use resources.conf_dir()")
    assert not bad, "\n".join(bad)


def test_conf_dir_is_the_checkouts_conf_folder():
    assert conf_dir() == REPO / "conf"


def help_lines(python: str, cwd: Path, env: dict | None = None) -> list[str]:
    proc = subprocess.run([python, "-m", "resfl_lightning.train", "--help"], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def assert_help_lists_conf(lines: list[str], conf: Path) -> None:
    """One line per group listing its options (train.yaml's default starred), one line per option."""
    defaults = {}
    for entry in re.findall(r"^  - (?:optional |override )?(\w+): (\w+)", (conf / "train.yaml").read_text(), re.M):
        defaults[entry[0]] = entry[1]
    groups = sorted(d.name for d in conf.iterdir() if d.is_dir() and d.name not in NOT_GROUPS)
    assert groups and {"dataset", "algorithm", "attack", "model", "fabric", "logger"} <= set(groups)
    for group in groups:
        options = sorted(p.stem for p in (conf / group).glob("*.yaml"))
        line = [ln for ln in lines if re.match(rf"{group}=\s", ln)]
        assert len(line) == 1, f"no single group line for {group}"
        shown = [o.strip().rstrip("*") for o in line[0].split("=", 1)[1].split("(")[0].split("|")]
        assert shown == options
        if defaults.get(group) in options:
            assert f"{defaults[group]}*" in line[0]
        for option in options:
            assert sum(ln.startswith(f"{group}={option} ") or ln == f"{group}={option}" for ln in lines) == 1
    assert not [ln for ln in lines if ln.startswith(("sweeps=", "hydra="))]


def test_help_lists_every_config_group_and_option(tmp_path: Path):
    lines = help_lines(sys.executable, tmp_path, {**os.environ, "OMP_NUM_THREADS": "1"})
    assert_help_lists_conf(lines, REPO / "conf")
    # The option line carries the option file's first comment line.
    described = [ln for ln in lines if ln.startswith("dataset=adult ")][0]
    assert "UCI Adult" in described


# --- the wheel, installed outside the checkout -------------------------------------------------------------------
TINY = ["logger=none", "progress=false", "model.scale=femto", "dataset.num_images=48", "dataset.image_size=64",
        "dataset.extra_reserve_images=0", "dataset.num_clients=2", "dataset.batch_size=8", "federation.rounds=1",
        "eval.every=1"]


def make_venv(root: Path) -> Path:
    """A fresh venv that sees this environment's site-packages (torch etc.) through a .pth file, but not its
    editable install of resfl_lightning (.pth files inside that folder are not processed)."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (purelib / "_parent_env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_trains_outside_the_checkout(tmp_path: Path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(REPO)], check=True, timeout=300)
    (wheel,) = dist.glob("resfl_lightning-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"resfl_lightning", wheel.name.split("-py")[0] + ".dist-info"}
    for path in (REPO / "conf").rglob("*.yaml"):
        assert f"resfl_lightning/conf/{path.relative_to(REPO / 'conf').as_posix()}" in names
    for path in (REPO / "callbacks").glob("*.py"):
        assert f"resfl_lightning/callbacks/{path.name}" in names

    venv = make_venv(tmp_path)
    python, bindir = str(venv / "bin" / "python"), venv / "bin"
    # --no-deps: the dependencies come from the parent environment through the .pth file
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], check=True, timeout=300)
    work = tmp_path / "elsewhere"  # an unrelated working directory: no conf/, no callbacks/, no checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RESFL_CACHE_DIR")}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline")
    code = ("import json, importlib.util as u, resfl_lightning.callbacks.export as e, resfl_lightning.resources as r; "
            "print(json.dumps([e.__file__, str(r.conf_dir()), u.find_spec('callbacks') is None, "
            "u.find_spec('conf') is None]))")
    probe = subprocess.run([python, "-c", code], cwd=work, env=env, capture_output=True, text=True, check=True)
    module, conf, no_callbacks, no_conf = json.loads(probe.stdout)
    site_dir = str(venv.resolve())
    assert module.startswith(site_dir) and conf.startswith(site_dir) and no_callbacks and no_conf

    assert_help_lists_conf(help_lines(python, work, env), Path(conf))
    run_dir = work / "runs" / "tiny"
    proc = subprocess.run([str(bindir / "resfl"), "train", *TINY, f"run_dir={run_dir}"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [json.loads(x)["round"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0]
    assert (run_dir / "export" / "global.pt").is_file() and (work / ".cache" / "synthetic").is_dir()
    code = ("import sys, numpy as np; from ultralytics import YOLO; "
            "r = YOLO(sys.argv[1]).predict(np.zeros((64, 64, 3), np.uint8), conf=0.01, verbose=False)[0]; "
            "print(r.names, r.boxes.xyxy.shape[1])")
    proc = subprocess.run([python, "-c", code, str(run_dir / "export" / "global.pt")], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["{0:", "'person'}", "4"], proc.stderr[-3000:]
    proc = subprocess.run([str(bindir / "resfl"), "report", str(run_dir)], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run_dir / "report" / "report.md").is_file()
