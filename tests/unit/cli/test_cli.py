"""`resfl`: one console command whose --help lists every subcommand without importing torch, each subcommand documents
itself, and `resfl train` takes Hydra's own syntax (overrides, --cfg, -m)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# What the project offers as commands; a command dropped from the dispatcher (or never added) fails here.
EXPECTED = ("train", "data", "table", "robustness", "frontier", "dp-curve", "tune", "experiment", "index", "ledger",
            "compare", "report", "privacy", "bench", "export", "predict", "finetune", "ufm-valsize")
# Modules of resfl_lightning/cli/ that are not subcommands themselves
NOT_COMMANDS = ("__init__", "hydra_help", "bench_round_child", "experiment_args", "input_errors",  # their helpers
                "train_once")
ENV = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "COLUMNS": "120"}


def resfl(*args: str, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "resfl_lightning", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def listed_commands(text: str) -> list[str]:
    lines = text.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return [line.split()[0] for line in lines]


def test_help_lists_every_command_once_with_a_description():
    for args in (["--help"], []):
        proc = resfl(*args)
        assert proc.returncode == 0, proc.stderr
        assert listed_commands(proc.stdout) == list(EXPECTED)
        assert all(len(line.split(None, 1)) == 2 for line in proc.stdout.split("commands:\n", 1)[1].splitlines()[:10])


def test_every_command_module_is_reachable_from_the_dispatcher():
    from resfl_lightning.cli import COMMANDS

    modules = {p.stem for p in (REPO / "resfl_lightning" / "cli").glob("*.py")} - set(NOT_COMMANDS)
    assert modules == {c.module for c in COMMANDS.values()}


def test_help_does_not_import_torch():
    code = ("import sys; from resfl_lightning.cli import main; main(['--help']); "
            "assert 'torch' not in sys.modules and 'hydra' not in sys.modules, sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("command", [c for c in EXPECTED if c != "train"] + ["bench round", "bench scale"])
def test_every_command_prints_its_usage_in_process(command: str, capsys):
    from resfl_lightning.cli import main

    with pytest.raises(SystemExit) as exit_info:  # argparse exits 0 after printing --help
        main([*command.split(), "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: resfl {command}")


@pytest.mark.slow
@pytest.mark.parametrize("command", [*EXPECTED, "bench round", "bench scale"])
def test_every_command_documents_itself(command: str):
    proc = resfl(*command.split(), "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    if command == "train":  # Hydra's help: the config groups
        assert "== Config groups" in proc.stdout and "algorithm=" in proc.stdout
    else:
        assert proc.stdout.startswith(f"usage: resfl {command}")


def test_unknown_command_is_named():
    proc = resfl("trian")
    assert proc.returncode == 2 and "unknown command 'trian'" in proc.stderr and "train" in proc.stderr


@pytest.mark.slow
def test_train_takes_hydra_overrides_and_flags(tmp_path: Path):
    proc = resfl("train", "--cfg", "job", "dataset=adult", "federation.rounds=3", "algorithm=resfl_af_slices",
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "  rounds: 3\n" in proc.stdout and "  name: adult\n" in proc.stdout
    assert "  ufm_cohorts: slices\n" in proc.stdout  # the preset's UFM cohorts (ufm.cohorts reads it)
    bad = resfl("train", "--cfg", "job", "not_a_key.x=1", cwd=tmp_path)
    assert bad.returncode != 0 and "not_a_key" in bad.stderr
    # -m: a sweep of two jobs; the first stops at its config error (before any data is built) with exit code 2
    sweep = resfl("train", "-m", "algorithm.beta=-2,-3", "logger=none", "progress=false", cwd=tmp_path)
    assert "Launching 2 jobs locally" in sweep.stdout + sweep.stderr and sweep.returncode == 2, sweep.stderr[-3000:]
    assert "algorithm.beta" in sweep.stderr


def test_train_alias_and_resfl_train_compose_the_same_config(tmp_path: Path):
    args = ["--cfg", "job", "dataset=adult", "seed=3"]
    alias = subprocess.run([sys.executable, "-m", "resfl_lightning.train", *args], cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert alias.returncode == 0 and alias.stdout == resfl("train", *args, cwd=tmp_path).stdout


@pytest.mark.slow
def test_train_on_two_processes_relaunches_resfl_train(tmp_path: Path):
    """Fabric's launcher re-runs the command line for rank 1: it must still read `resfl train ...`."""
    script = Path(sys.executable).parent / "resfl"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "resfl_lightning"]
    run_dir = tmp_path / "run"
    tiny = ["logger=none", "progress=false", "model.scale=femto", "dataset.num_images=48", "dataset.image_size=64",
            "dataset.extra_reserve_images=0", "dataset.num_clients=2", "dataset.batch_size=8", "federation.rounds=1",
            "fabric.devices=2", f"run_dir={run_dir}"]
    proc = subprocess.run([*command, "train", *tiny], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in (run_dir / "train_ddp_process_1.log").read_text()
    assert (run_dir / "summary.json").is_file()


@pytest.mark.parametrize("command", ["table", "robustness", "frontier", "tune", "dp_curve"])
def test_experiment_commands_share_their_run_options(command):
    """--dataset/--scenario/--jobs/--out/--results and the overrides parse alike everywhere; --jobs 0 is refused."""
    import importlib

    parse_args = importlib.import_module(f"resfl_lightning.cli.{command}").parse_args
    args = parse_args(["--dataset", "adult", "--scenario", "group_skew", "--jobs", "3", "--out", "o", "a.b=1"])
    assert (args.dataset, args.scenario, args.jobs, str(args.out), args.overrides) == ("adult", "group_skew", 3, "o",
                                                                                       ["a.b=1"])
    with pytest.raises(SystemExit, match="--jobs must be >= 1"):
        parse_args(["--jobs", "0"])


def test_a_planned_stop_at_the_start_deadline_exits_0_with_its_message(monkeypatch, capsys):
    from resfl_lightning import cli
    from resfl_lightning.analysis import execute, runner

    def stopped(*args, **kwargs):
        raise runner.StoppedStarting("stopped starting runs at the --stop-starting-after deadline: 3 of 5 runs")

    monkeypatch.setattr(execute, "execute", stopped)
    monkeypatch.setattr(runner, "_START_DEADLINE", None)  # the deadline parse sets is undone after the test
    assert cli.main(["robustness", "--dataset", "adult", "--stop-starting-after", "30"]) == 0
    assert "3 of 5 runs" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="must be > 0"):
        cli.main(["robustness", "--dataset", "adult", "--stop-starting-after", "0"])
