"""Bad user input stops a command with one line on stderr naming the file, line, column or key, exit status 2 and no
traceback (resfl_lightning/cli/input_errors.py); HYDRA_FULL_ERROR=1 shows the traceback. Each case goes through the
real entry: `resfl train` as a subprocess, `resfl data` through the dispatcher in process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from resfl_lightning.data.errors import TableError
from tests.helpers import write_loans, write_tiny_yolo

REPO = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
ENV.pop("HYDRA_FULL_ERROR", None)


def csv_keys(path: Path, target: str = "approved") -> list[str]:
    return ["dataset=csv", f"dataset.path={path}", f"dataset.target={target}", "dataset.positive=[yes]",
            "dataset.sensitive=race"]


def yolo_keys(data_yaml: Path, groups: Path) -> list[str]:
    return ["dataset=yolo", f"dataset.data={data_yaml}", f"dataset.groups_file={groups}", "dataset.num_clients=2"]


def edit_line(path: Path, line_no: int, edit) -> None:
    lines = path.read_text().splitlines()
    lines[line_no - 1] = edit(lines[line_no - 1])
    path.write_text("\n".join(lines) + "\n")


def bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """case -> (overrides, the one line expected on stderr)."""
    loans = tmp_path / "loans.csv"
    write_loans(loans)
    number = tmp_path / "number.csv"  # line 7: the income field (a numeric column) holds text
    write_loans(number)
    edit_line(number, 7, lambda line: ",".join([line.split(",")[0], "lots", *line.split(",")[2:]]))
    extra = tmp_path / "extra.csv"  # line 9: one field too many
    write_loans(extra)
    edit_line(extra, 9, lambda line: line + ",surplus")
    data_yaml, groups = write_tiny_yolo(tmp_path / "y")
    no_image = tmp_path / "no_image.csv"  # line 4 names an image the data.yaml folders do not hold
    no_image.write_text(groups.read_text().replace("train_001.jpg,0,light", "train_999.jpg,0,light"))
    malformed = tmp_path / "malformed.csv"  # line 4: four fields under a three-field header
    malformed.write_text(groups.read_text())
    edit_line(malformed, 4, lambda line: line + ",cam1")
    box = tmp_path / "box.csv"  # line 2: the box column is no label row number
    box.write_text(groups.read_text().replace("train_000.jpg,0,dark", "train_000.jpg,first,dark"))
    return {
        "missing target column": (csv_keys(loans, target="approval"),
                                  f"table error: {loans}: no column 'approval' (named by dataset.target); the file has "
                                  "columns age, income, race, region, approved"),
        "text in a numeric column": (csv_keys(number),
                                     f"table error: {number} line 7 column 'income': 'lots' is not a number (the "
                                     "column is numeric; list it in dataset.categorical if it holds categories)"),
        "malformed line": (csv_keys(extra), f"table error: {extra}: cannot parse as CSV (sep=','): Error tokenizing "
                                            "data. C error: Expected 5 fields in line 9, saw 6"),
        "missing image": (yolo_keys(data_yaml, no_image),
                          f"annotation error: {no_image} line 4 column 'image': 'train_999.jpg' is not an image of "
                          f"{data_yaml}"),
        "malformed groups file": (yolo_keys(data_yaml, malformed),
                                  f"annotation error: {malformed} line 4: 4 fields, but the header (image,box,group) "
                                  "has 3"),
        "bad box in groups file": (yolo_keys(data_yaml, box),
                                   f"annotation error: {box} line 2 column 'box': 'first' is not a row number"),
        "unknown group name": ([*csv_keys(loans), "dataset.protected_group=Purple"],
                               "config error: dataset.protected_group: 'Purple' is not a group of this data; its "
                               "groups are 0=Asian, 1=Black, 2=White (give a name or an index)"),
        "unknown key": ([*csv_keys(loans), "dataset.protected=Black"],
                        "config error: Could not override 'dataset.protected'. To append to your config use "
                        "+dataset.protected=Black"),
    }


CASES = ["missing target column", "text in a numeric column", "malformed line", "missing image",
         "malformed groups file", "bad box in groups file", "unknown group name", "unknown key"]


@pytest.mark.parametrize("case", CASES)
def test_resfl_data_reports_bad_input_in_one_line(case, tmp_path, capsys, monkeypatch):
    from resfl_lightning import cli

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setenv("RESFL_CACHE_DIR", str(tmp_path / "cache"))
    overrides, expected = bad_inputs(tmp_path)[case]
    with pytest.raises(SystemExit) as stop:
        cli.main(["data", *overrides])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [expected]
    assert "Traceback" not in captured.err + captured.out


def test_full_error_shows_the_exception(tmp_path, monkeypatch):
    from resfl_lightning import cli

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    monkeypatch.setenv("RESFL_CACHE_DIR", str(tmp_path / "cache"))
    overrides, _ = bad_inputs(tmp_path)["missing target column"]
    with pytest.raises(TableError, match="no column 'approval'"):
        cli.main(["data", *overrides])


@pytest.mark.parametrize("case", ["missing target column", "missing image", "unknown key"])
def test_resfl_train_reports_bad_input_in_one_line(case, tmp_path):
    overrides, expected = bad_inputs(tmp_path)[case]
    command = [sys.executable, "-m", "resfl_lightning", "train", *overrides, "logger=none", "progress=false",
               f"run_dir={tmp_path / 'run'}"]
    env = {**ENV, "RESFL_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [expected]
    assert "Traceback" not in proc.stdout
    if case == "missing target column":  # the traceback on request
        full = subprocess.run(command, cwd=tmp_path, env={**env, "HYDRA_FULL_ERROR": "1"}, capture_output=True,
                              text=True, timeout=300)
        assert full.returncode != 0 and "Traceback" in full.stderr and "TableError" in full.stderr


def test_a_reserve_too_small_for_the_attacks_is_one_config_line(tmp_path):
    """The README's `resfl table` runs the privacy attacks; on a small table the attack reserve is too small for the
    MIA's split: a config error naming dataset.reserve_fraction, found at the start of training."""
    loans = tmp_path / "loans.csv"
    write_loans(loans)  # 400 rows: 320 training rows, a reserve of 16
    command = [sys.executable, "-m", "resfl_lightning", "train", *csv_keys(loans), "attack=privacy", "logger=none",
               "progress=false", f"run_dir={tmp_path / 'run'}"]
    proc = subprocess.run(command, cwd=tmp_path, env={**ENV, "RESFL_CACHE_DIR": str(tmp_path / "cache")},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(proc.stderr.splitlines()) == 1
    assert re.fullmatch(r"config error: dataset\.reserve_fraction: the attack reserve of 16 items is too small for "
                        r"the MIA split \{.*\} \(need >= 6 each\): raise dataset\.reserve_fraction or the dataset size",
                        proc.stderr.strip())


def test_clients_too_small_under_small_clients_error_is_one_config_line(tmp_path, capsys, monkeypatch):
    from resfl_lightning import cli

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setenv("RESFL_CACHE_DIR", str(tmp_path / "cache"))
    loans = tmp_path / "loans.csv"
    write_loans(loans)  # 320 training rows less the reserve over 200 clients: one or two rows each
    with pytest.raises(SystemExit) as stop:
        cli.main(["data", *csv_keys(loans), "dataset.num_clients=200", "dataset.small_clients=error"])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: dataset.small_clients=error, val_fraction=0.1: ")
    assert "client '0'" in lines[0] and "Traceback" not in lines[0]
