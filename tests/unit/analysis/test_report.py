"""Offline report: series read back from metrics.jsonl, figures, report.md with the summary table, W&B images."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from resfl_lightning.analysis.report import (
    client_matrix,
    final_group_tpr,
    load_rounds,
    log_report_figures,
    round_series,
    summary_table,
    write_report,
)
from resfl_lightning.analysis.report_figures import ReportFigures
from resfl_lightning.cli.report import main

ROUNDS, CLIENTS = 5, 3


def make_run(root: Path, name: str, shift: float, grouping: str = "mst3") -> Path:
    """A run directory whose values are simple functions of (round, client), so every series has a known answer."""
    run = root / name
    run.mkdir(parents=True)
    rows = []
    for t in range(ROUNDS):
        row = {"round": t, "lr_factor": 1.0}
        for c in range(CLIENTS):
            row[f"client/{c}/weight"] = (c + 1) / 6
            row[f"client/{c}/u"] = 0.1 * c + 0.01 * t
            row[f"client/{c}/ufm_raw"] = None if (c, t) == (1, 2) else 0.2 * c + shift
        if t in (0, 2, 4):  # evaluation rounds only
            row.update({"test/map": 0.1 * t + shift, "test/map_50": 0.2 * t + shift, "test/delta_eop": 0.3 - 0.05 * t,
                        "test/tpr/0": 0.5 + 0.1 * t / 4, "test/tpr/2": 0.4 + shift, "test/di": None})
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"test/map": 0.4 + shift, "test/delta_eop": 0.1, "test/tpr/0": 0.6, "test/di": None,
               "score/fairness": 0.25 + shift, "rounds_completed": ROUNDS, "mean_time/train": 12.5}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.yaml").write_text(f"dataset:\n  name: synthetic\n  grouping: {grouping}\n")
    return run


def test_series_come_back_from_metrics_jsonl(tmp_path: Path):
    run = load_rounds(make_run(tmp_path, "a", shift=0.05))
    x, y = round_series(run.rows, "test/map_50")
    np.testing.assert_array_equal(x, [0, 2, 4])
    np.testing.assert_allclose(y, [0.05, 0.45, 0.85])
    assert round_series(run.rows, "test/di")[0].size == 0  # null everywhere -> no points
    assert final_group_tpr(run.rows) == pytest.approx({0: 0.6, 2: 0.45})
    rounds, clients, w = client_matrix(run.rows, "weight")
    assert clients == [0, 1, 2] and rounds.tolist() == list(range(ROUNDS))
    np.testing.assert_allclose(w, np.repeat([[1 / 6], [2 / 6], [3 / 6]], ROUNDS, axis=1))
    _, _, u = client_matrix(run.rows, "u")
    np.testing.assert_allclose(u[2], 0.2 + 0.01 * np.arange(ROUNDS))
    _, _, ufm = client_matrix(run.rows, "ufm_raw")
    assert math.isnan(ufm[1, 2]) and ufm[1, 3] == pytest.approx(0.25)
    assert run.config["dataset"]["grouping"] == "mst3" and run.summary["rounds_completed"] == ROUNDS


def test_report_writes_figures_and_summary_table(tmp_path: Path):
    a, b = make_run(tmp_path, "resfl", 0.05), make_run(tmp_path, "fedavg", 0.0)
    out = tmp_path / "rep"
    path = write_report([a, b], out)
    text = path.read_text()
    figures = ["utility_fairness.png", "group_tpr.png", "clients_resfl.png", "clients_fedavg.png"]
    for name in figures:
        assert f"]({name})" in text
        img = np.asarray(Image.open(out / name).convert("L"), dtype=float)
        assert img.shape[0] > 200 and img.shape[1] > 300 and img.std() > 5  # a drawn figure, not a blank canvas
    table = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
             for line in text.splitlines() if line.startswith("| `")}
    assert table["`test/map`"] == ["0.45", "0.4"]
    assert table["`score/fairness`"] == ["0.3", "0.25"]
    assert table["`rounds_completed`"] == ["5", "5"] and table["`mean_time/train`"] == ["12.5", "12.5"]
    assert "`test/di`" not in table and "`test/tpr/0`" not in table  # nulls and per-group rows stay out
    assert "| metric | resfl | fedavg |" in text


def test_summary_table_falls_back_to_logged_test_metrics_without_summary(tmp_path: Path):
    run_dir = make_run(tmp_path, "crashed", 0.0)
    (run_dir / "summary.json").unlink()  # a run that stopped before the end
    table = summary_table([load_rounds(run_dir)])
    assert "| `test/map` | 0.4 |" in table and "| `test/delta_eop` | 0.1 |" in table


def test_cli_defaults_to_the_run_directory_and_names_bad_inputs(tmp_path: Path, capsys):
    run_dir = make_run(tmp_path, "one", 0.0, grouping="mst10")
    main([str(run_dir)])
    assert (run_dir / "report" / "report.md").is_file() and (run_dir / "report" / "group_tpr.png").is_file()
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "nope")])
    assert exc.value.code == 2 and "metrics.jsonl not found" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"round": 0}\n{oops\n')
    with pytest.raises(SystemExit):
        main([str(bad)])
    assert "metrics.jsonl:2" in capsys.readouterr().err


class FakeWandb:
    def __init__(self):
        self.images: dict[str, list[str]] = {}

    def log_image(self, key, images, step=None):
        self.images[key] = images
        self.step = step


def test_figures_are_logged_as_images_by_the_fit_end_callback(tmp_path: Path):
    run_dir = make_run(tmp_path, "run", 0.0)
    logger = FakeWandb()
    paths = log_report_figures(run_dir, [logger])
    assert sorted(logger.images) == sorted(f"report/{p.stem}" for p in paths) and logger.step == ROUNDS - 1
    assert all(Path(v[0]).is_file() for v in logger.images.values())

    def federation(rank_zero: bool, loggers: list):
        return SimpleNamespace(fabric=SimpleNamespace(is_global_zero=rank_zero, loggers=loggers))

    csv_like, wandb_like, other_rank = object(), FakeWandb(), FakeWandb()
    ReportFigures(run_dir).on_fit_end(federation(True, [csv_like, wandb_like]))
    ReportFigures(run_dir).on_fit_end(federation(False, [other_rank]))
    assert len(wandb_like.images) == 3 and other_rank.images == {}


@pytest.mark.slow
def test_a_wandb_run_logs_the_figures_as_images(tmp_path: Path):
    """Through the real entry point with W&B offline: the report figures land in the run's W&B media."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "resfl_lightning.train", "logger=wandb", "progress=false", "model.scale=femto",
           "dataset.num_images=48", "dataset.image_size=64", "dataset.extra_reserve_images=0", "dataset.num_clients=2",
           "dataset.batch_size=8", "federation.rounds=2", "eval.every=1", f"run_dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    logged = {p.name.split("_")[0] for p in run_dir.glob("wandb/offline-run-*/files/media/images/report/*.png")}
    assert logged == {"utility", "group", "clients"}
    assert sorted(p.name for p in (run_dir / "report").glob("*.png")) == ["clients_run.png", "group_tpr.png",
                                                                           "utility_fairness.png"]


def test_the_membership_audit_roc_is_drawn_from_the_last_round_with_scores(tmp_path: Path):
    """attack.mia.method=lira | rmia writes every candidate's score into the round's attack file; the report draws
    the ROC of the last such round (log-log), and leaves the figure out when no run has one."""
    from resfl_lightning.analysis.report import final_mia_scores, load_rounds

    plain = make_run(tmp_path, "plain", 0.0)
    audited = make_run(tmp_path, "audited", 0.1)
    (audited / "attacks").mkdir()
    for r, shift in ((0, 0.0), (1, 2.0)):
        mia = {"method": "rmia", "scores": {"members": (np.linspace(0, 1, 50) + shift).tolist(),
                                            "nonmembers": np.linspace(0, 1, 200).tolist()}}
        (audited / "attacks" / f"privacy_round_{r:04d}.json").write_text(json.dumps({"mia": mia}))
    method, members, nonmembers = final_mia_scores(load_rounds(audited))
    assert method == "rmia" and members.min() == 2.0 and nonmembers.size == 200  # round 1, the last
    assert final_mia_scores(load_rounds(plain)) is None
    write_report([plain, audited], tmp_path / "out")
    assert Image.open(tmp_path / "out" / "mia_roc.png").size[0] > 300
    write_report([plain], tmp_path / "plain_only")
    assert not (tmp_path / "plain_only" / "mia_roc.png").exists()
