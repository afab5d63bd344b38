"""Committed files hold no machine's paths: a data root is written as its placeholder (dataset.root=<adult>), a path
in the checkout relative to it; a ledger entry restored on another machine gets that machine's data root back, and its
run counts as finished with the settings the command composes there."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.analysis import run_ledger
from resfl_lightning.analysis.portable_paths import CHECKOUT, localised, portable, portable_command
from resfl_lightning.analysis.run_ledger import Ledger, make_portable
from resfl_lightning.analysis.run_records import is_finished
from resfl_lightning.analysis.run_settings import composed_settings, finished_run_mismatch, stale_runs

HOME = Path("/home/someone")


def test_data_roots_become_placeholders_and_checkout_paths_relative():
    text = (f'["{CHECKOUT}/.venv/bin/python", "run_dir={CHECKOUT}/runs/exp/fedavg-s0", "{CHECKOUT}", '
            '"dataset.root=/data/uci/adult", "/data/uci/adult/adult.data", "/data/uci/adult2", "/data/uci/adults"]')
    assert json.loads(portable(text, ["/data/uci/adult"], home=HOME)) == [
        ".venv/bin/python", "run_dir=runs/exp/fedavg-s0", ".", "dataset.root=<adult>", "<adult>/adult.data",
        "/data/uci/adult2", "/data/uci/adults"]  # another folder whose name only starts the same stays
    assert portable("python: /home/someone/.pyenv/bin/python3 /home/someoneelse", home=HOME) == (
        "python: ~/.pyenv/bin/python3 /home/someoneelse")
    assert portable(f"{CHECKOUT}x/y", home=HOME) == f"{CHECKOUT}x/y"  # a sibling folder of the checkout


def test_a_root_given_with_a_trailing_slash_or_relative_becomes_its_placeholder():
    assert portable("root: /data/adult/\nrows: /data/adult/adult.data", ["/data/adult/"], home=HOME) == (
        "root: <adult>\nrows: <adult>/adult.data")
    assert portable("root: ../shared/data/adult\nname: adult", ["../shared/data/adult"], home=HOME) == (
        "root: <adult>\nname: adult")  # the dataset's name is no path


def test_localised_puts_this_machines_root_in_place_of_its_placeholder_only():
    text = "root: <adult>\nnegative: <=50K\nmissing: <absent>\nother: <facet>"
    assert localised(text, ["/mnt/d/adult"]) == "root: /mnt/d/adult\nnegative: <=50K\nmissing: <absent>\nother: <facet>"
    assert localised(text, []) == text


def test_the_results_header_command_names_the_placeholder():
    argv = ["resfl", "table", "--ledger", f"{CHECKOUT}/docs/results/ledgers", "--out", "runs/t",
            "dataset.root=/data/uci/adult", "dataset.sensitive=race"]
    assert portable_command(argv) == ("resfl table --ledger docs/results/ledgers --out runs/t dataset.root=<adult> "
                                      "dataset.sensitive=race")


def _finished_adult_run(run_dir: Path, root: Path) -> tuple[Path, list[str]]:
    """A finished run folder trained on the data at `root`, as the launcher leaves it; and its overrides."""
    overrides = ["dataset=adult", f"dataset.root={root}", "algorithm=fedavg", "seed=3", f"run_dir={run_dir}"]
    run_dir.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(composed_settings(overrides)), run_dir / "config.yaml")
    (run_dir / "summary.json").write_text(json.dumps({"test/accuracy": 0.84}))
    command = [str(CHECKOUT / ".venv" / "bin" / "python"), "-m", "resfl_lightning.train", *overrides]
    (run_dir / "table_wall_s.json").write_text(json.dumps({"wall_s": 12.5, "command": command}))
    return run_dir, overrides


def _chunk_text(ledger: Path) -> str:
    return "".join(gzip.open(chunk, "rt").read() for chunk in sorted(ledger.rglob("*.jsonl.gz")))


def _restores_as_not_stale(tmp_path: Path, ledger: Path) -> None:
    """Another machine, its data elsewhere: the run is restored, with that machine's root, and is not stale."""
    root = tmp_path / "machine2" / "shared" / "adult"
    target = tmp_path / "machine2" / "exp" / "fedavg-s3"
    overrides = ["dataset=adult", f"dataset.root={root}", "algorithm=fedavg", "seed=3", f"run_dir={target}"]
    fresh = Ledger(ledger)
    fresh.sync([(target, overrides)], lambda _: None)
    assert is_finished(target) and len(fresh.restored) == 1
    assert OmegaConf.load(target / "config.yaml").dataset.root == str(root)
    assert f"dataset.root={root}" in json.loads((target / "table_wall_s.json").read_text())["command"]
    assert finished_run_mismatch(target, overrides) == [] and stale_runs([(target, overrides)]) == []


def test_a_recorded_entry_holds_no_machine_path_and_restores_elsewhere(tmp_path: Path):
    made, overrides = _finished_adult_run(tmp_path / "machine1" / "exp" / "fedavg-s3",
                                          tmp_path / "machine1" / "data" / "adult")
    Ledger(tmp_path / "ledger").record(made, overrides)
    text = _chunk_text(tmp_path / "ledger")
    assert str(tmp_path / "machine1" / "data") not in text and str(CHECKOUT) not in text
    (entry,) = Ledger(tmp_path / "ledger").entries("exp").values()
    assert "dataset.root=<adult>" in entry["overrides"] and "  root: <adult>\n" in entry["files"]["config.yaml"]
    assert json.loads(entry["files"]["table_wall_s.json"])["command"][0] == ".venv/bin/python"
    _restores_as_not_stale(tmp_path, tmp_path / "ledger")


def test_a_ledger_written_with_absolute_paths_restores_and_is_made_portable(tmp_path: Path, monkeypatch):
    made, overrides = _finished_adult_run(tmp_path / "machine1" / "exp" / "fedavg-s3",
                                          tmp_path / "machine1" / "data" / "adult")
    monkeypatch.setattr(run_ledger, "portable_entry", lambda entry: entry)  # as entries were recorded before
    Ledger(tmp_path / "old", stamp="1").record(made, overrides)
    monkeypatch.undo()
    assert str(tmp_path / "machine1" / "data" / "adult") in _chunk_text(tmp_path / "old")
    _restores_as_not_stale(tmp_path / "a", tmp_path / "old")

    (chunk,) = (tmp_path / "old" / "exp").glob("*.jsonl.gz")
    before = json.loads(gzip.open(chunk, "rt").read())
    assert make_portable(tmp_path / "old") == (1, 1)
    after = json.loads(gzip.open(chunk, "rt").read())
    assert str(tmp_path / "machine1" / "data") not in json.dumps(after) and str(CHECKOUT) not in json.dumps(after)
    assert {k: v for k, v in after.items() if k not in ("files", "overrides")} == {
        k: v for k, v in before.items() if k not in ("files", "overrides")}
    assert after["files"]["summary.json"] == before["files"]["summary.json"]
    written = chunk.read_bytes()
    assert written[4:8] == b"\0\0\0\0"  # no time in the gzip header: the same entries give the same bytes
    assert make_portable(tmp_path / "old") == (0, 0) and chunk.read_bytes() == written
    _restores_as_not_stale(tmp_path / "b", tmp_path / "old")
