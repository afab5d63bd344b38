"""The run ledger carries finished runs between machines: a run restored from it counts as finished only when its
saved settings are what the command composes now, and every run that finishes is added to it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from resfl_lightning.analysis import run_ledger
from resfl_lightning.analysis.run_ledger import Ledger
from resfl_lightning.analysis.run_records import is_finished
from resfl_lightning.analysis.run_settings import composed_settings

OVERRIDES = ["algorithm=fedavg", "seed=3"]


def finished(run_dir: Path, overrides: list[str], accuracy: float) -> Path:
    """A run folder as the launcher leaves a finished run: its composed config, summary and wall time."""
    run_dir.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(composed_settings([*overrides, f"run_dir={run_dir}"])), run_dir / "config.yaml")
    (run_dir / "summary.json").write_text(json.dumps({"test/accuracy": accuracy}))
    (run_dir / "table_wall_s.json").write_text(json.dumps({"wall_s": 12.5}))
    (run_dir / "metrics.jsonl").write_text('{"round": 0, "client/0/ufm_raw": 1.5, "share": 0.25}\n{"round": 1}\n')
    return run_dir


def test_a_recorded_run_is_restored_on_another_machine(tmp_path: Path, monkeypatch):
    ledger = Ledger(tmp_path / "ledger")
    made = finished(tmp_path / "machine1" / "exp" / "fedavg-s3", OVERRIDES, 0.84)
    ledger.record(made, [*OVERRIDES, f"run_dir={made}"])
    (chunk,) = (tmp_path / "ledger" / "exp").glob("*.jsonl.gz")
    entry = json.loads(gzip.open(chunk, "rt").readline())
    assert entry["run"] == "fedavg-s3" and entry["commit"] and entry["machine"] and entry["date"]
    assert "checkpoints" not in json.dumps(sorted(entry["files"]))

    fresh = Ledger(tmp_path / "ledger")
    target = tmp_path / "machine2" / "exp" / "fedavg-s3"
    lines: list[str] = []
    fresh.sync([(target, [*OVERRIDES, f"run_dir={target}"])], lines.append)
    assert is_finished(target)
    for name in ("summary.json", "config.yaml", "table_wall_s.json"):
        assert (target / name).read_text() == (made / name).read_text()
    assert not (target / "metrics.jsonl").exists()  # no command asked for it
    assert len(fresh.restored) == 1 and "1 finished runs restored" in lines[0]
    assert fresh.provenance().startswith("- ledger: 1 of the runs are in")
    assert "(1 restored from it by this command)" in fresh.provenance()


def test_the_header_names_the_commits_of_runs_recorded_by_earlier_commands_here(tmp_path: Path, monkeypatch):
    """A grid made over several sessions on one machine restores nothing, yet its runs were made at other commits."""
    early = finished(tmp_path / "m1" / "exp" / "fedavg-s3", OVERRIDES, 0.84)
    late = finished(tmp_path / "m1" / "exp" / "fedavg-s4", ["algorithm=fedavg", "seed=4"], 0.85)
    for run_dir, commit, date in ((early, "a" * 40, "2026-11-26T10:00:00+00:00"),
                                  (late, "b" * 40, "2026-11-27T10:00:00+00:00")):
        monkeypatch.setattr("resfl_lightning.analysis.checkout.git_commit", lambda c=commit: c)
        Ledger(tmp_path / "ledger", stamp=commit[0]).record(run_dir, [f"seed={run_dir.name[-1]}"])
        for chunk in (tmp_path / "ledger" / "exp").glob("*.jsonl.gz"):  # the date the entry was recorded at
            rows = [json.loads(line) for line in gzip.open(chunk, "rt")]
            rows = [{**r, "date": date} if r["run"] == run_dir.name else r for r in rows]
            with gzip.open(chunk, "wt") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)
    (late / "summary.json").write_text(json.dumps({"test/accuracy": 0.9}))  # trained again here, not yet recorded
    ledger = Ledger(tmp_path / "ledger")
    ledger.sync([(early, OVERRIDES), (late, ["algorithm=fedavg", "seed=4"])], lambda _: None)
    assert not ledger.restored
    line = ledger.provenance()
    assert line.startswith("- ledger: 1 of the runs are in") and "(0 restored from it by this command)" in line
    assert "recorded 2026-11-26 to 2026-11-26 at commits (runs) aaaaaaaaaaaa (1) on (runs) " in line
    (late / "summary.json").write_text(json.dumps({"test/accuracy": 0.85}))  # the ledger's run again
    line = ledger.provenance()
    assert "2 of the runs" in line
    assert "2026-11-26 to 2026-11-27 at commits (runs) aaaaaaaaaaaa (1), bbbbbbbbbbbb (1)" in line


def test_the_header_names_the_cpus_and_kernels_its_runs_were_recorded_on(tmp_path: Path, monkeypatch):
    """One lock on another CPU ISA trains other floats (docs/design.md, Invariants): the header counts the runs per
    CPU model and torch kernels, and says so of entries whose machine string named neither (before 9945b40)."""
    runs = [finished(tmp_path / "m1" / "exp" / f"fedavg-s{s}", ["algorithm=fedavg", f"seed={s}"], 0.84) for s in (3, 4)]
    for run_dir, text, stamp in zip(runs, ("Linux-6, x86_64, 2 CPUs, Python 3.11.7",
                                           "Linux-6, x86_64, 2 CPUs (AMD EPYC 9654), torch 2.14.1 AVX2 MKL, Python 3"),
                                    "ab"):
        monkeypatch.setattr("resfl_lightning.analysis.checkout.machine", lambda t=text: t)
        Ledger(tmp_path / "ledger", stamp=stamp).record(run_dir, [f"seed={run_dir.name[-1]}"])
    ledger = Ledger(tmp_path / "ledger")
    ledger.sync([(r, ["algorithm=fedavg", f"seed={r.name[-1]}"]) for r in runs], lambda _: None)
    assert ("on (runs) CPU and kernels not recorded (1), AMD EPYC 9654, torch 2.14.1 AVX2 MKL (1): "
            in ledger.provenance())


def test_a_run_recorded_after_a_settings_change_is_checked_against_what_it_was_trained_with(tmp_path: Path):
    """The ledger once stamped a fingerprint of conf/ when a run was recorded, not when it was trained, and skipped
    the check when the stamp matched: a run trained before a tuned file changed, recorded after it, was reused. Now
    the saved config (written when the run started) is compared whatever the entry says."""
    made = finished(tmp_path / "m1" / "exp" / "fedavg-s3", [*OVERRIDES, "optim.lr=0.5"], 0.84)  # trained so
    Ledger(tmp_path / "ledger").record(made, OVERRIDES)  # recorded under today's overrides
    target = tmp_path / "m2" / "exp" / "fedavg-s3"
    fresh = Ledger(tmp_path / "ledger")
    lines: list[str] = []
    fresh.sync([(target, [*OVERRIDES, f"run_dir={target}"])], lines.append)
    assert not is_finished(target) and not fresh.restored
    assert "optim.lr: 0.5 ->" in lines[0]


def test_a_run_recorded_from_a_dirty_tree_is_marked_in_the_header(tmp_path: Path, monkeypatch):
    made = finished(tmp_path / "m1" / "exp" / "fedavg-s3", OVERRIDES, 0.84)
    monkeypatch.setattr("resfl_lightning.analysis.checkout.git_commit",
                        lambda: "c" * 40 + " (with uncommitted changes)")
    ledger = Ledger(tmp_path / "ledger")
    ledger.record(made, OVERRIDES)
    ledger.sync([(made, OVERRIDES)], lambda _: None)
    line = ledger.provenance()
    assert "cccccccccccc+dirty (1)" in line and "1 of them were recorded from a tree with uncommitted changes" in line
    assert run_ledger.summarise(tmp_path / "ledger")[0].commits == ("cccccccccccc+dirty",)


def test_a_composed_cell_gives_each_seed_what_composing_it_alone_gives():
    """Composition is cached per grid cell with seed and run_dir set afterwards; the result must equal composing
    the run's own overrides (run_name interpolates the seed)."""
    from resfl_lightning.analysis import run_settings

    base = ["dataset=adult", "algorithm=resfl", "logger=none"]
    run_settings.composed_settings([*base, "seed=0", "run_dir=runs/x-s0"])  # fills the cache
    cached = run_settings.composed_settings([*base, "seed=7", "run_dir=runs/x-s7"])
    run_settings.clear_composed()
    alone = run_settings.composed_settings([*base, "seed=7", "run_dir=runs/x-s7"])
    assert cached == alone and cached["seed"] == 7 and cached["run_name"].endswith("-s7")


def test_a_run_made_with_other_settings_is_not_restored(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger")
    made = finished(tmp_path / "m1" / "exp" / "fedavg-s3", OVERRIDES, 0.84)
    ledger.record(made, OVERRIDES)
    target = tmp_path / "m2" / "exp" / "fedavg-s3"
    lines: list[str] = []
    fresh = Ledger(tmp_path / "ledger")
    fresh.sync([(target, ["algorithm=fedavg", "seed=3", "federation.rounds=2", f"run_dir={target}"])], lines.append)
    assert not is_finished(target) and not fresh.restored and fresh.provenance() is None
    assert not target.exists()  # nothing written for a run that is trained again
    assert "1 not (made with other settings; trained again): fedavg-s3: federation.rounds" in lines[0]


def test_finished_runs_the_ledger_lacks_are_recorded_and_chunks_rotate(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(run_ledger, "CHUNK_RUNS", 2)
    runs = [finished(tmp_path / "m1" / "exp" / f"fedavg-s{s}", ["algorithm=fedavg", f"seed={s}"], s / 4)
            for s in (1, 2, 3)]
    ledger = Ledger(tmp_path / "ledger")
    ledger.sync([(rd, ["algorithm=fedavg", f"seed={s}", f"run_dir={rd}"]) for s, rd in zip((1, 2, 3), runs)])
    assert len(list((tmp_path / "ledger" / "exp").glob("*.jsonl.gz"))) == 2  # 2 + 1 entries
    entries = Ledger(tmp_path / "ledger").entries("exp")
    assert sorted(entries) == ["fedavg-s1", "fedavg-s2", "fedavg-s3"]
    reads = []
    counting = Ledger(tmp_path / "ledger")
    monkeypatch.setattr(counting, "entries", lambda name: reads.append(name) or entries)
    counting.sync([(rd, ["algorithm=fedavg", f"seed={s}", f"run_dir={rd}"]) for s, rd in zip((1, 2, 3), runs)])
    assert reads == ["exp"]  # the chunks are read once per experiment, not once per job
    assert json.loads(entries["fedavg-s3"]["files"]["summary.json"]) == {"test/accuracy": 0.75}


def test_dropped_entries_are_trained_again_and_the_rest_restored(tmp_path: Path, monkeypatch, capsys):
    """`resfl ledger DIR --drop EXP --match GLOB`: the matching entries leave every chunk (one left empty is
    deleted), the others stay byte for byte, and a fresh machine restores only those."""
    from resfl_lightning.cli.ledger import main as ledger_main

    monkeypatch.setattr(run_ledger, "CHUNK_RUNS", 2)
    names = {"krum-s1": 1, "median-s2": 2, "krum-s3": 3}
    runs = {n: finished(tmp_path / "m1" / "exp" / n, ["algorithm=fedavg", f"seed={s}"], s / 4)
            for n, s in names.items()}
    Ledger(tmp_path / "ledger").sync([(rd, ["algorithm=fedavg", f"seed={names[n]}", f"run_dir={rd}"])
                                      for n, rd in runs.items()])
    first, second = sorted((tmp_path / "ledger" / "exp").glob("*.jsonl.gz"))  # [krum-s1, median-s2], [krum-s3]
    assert ledger_main([str(tmp_path / "ledger"), "--drop", "exp", "--match", "krum-*"]) == 0
    assert "exp: 2 entries dropped (krum-s1 ... krum-s3)" in capsys.readouterr().out
    assert first.is_file() and not second.exists() and not list(first.parent.glob("*.partial"))
    assert sorted(Ledger(tmp_path / "ledger").entries("exp")) == ["median-s2"]

    fresh = Ledger(tmp_path / "ledger")
    targets = {n: tmp_path / "m2" / "exp" / n for n in names}
    fresh.sync([(rd, ["algorithm=fedavg", f"seed={names[n]}", f"run_dir={rd}"]) for n, rd in targets.items()])
    assert [is_finished(targets[n]) for n in names] == [False, True, False]
    assert ledger_main([str(tmp_path / "ledger")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("exp: 1 runs in 1 chunks, recorded ")
    with pytest.raises(SystemExit, match="no such experiment"):
        ledger_main([str(tmp_path / "ledger"), "--drop", "nope", "--match", "*"])


def test_a_broken_chunk_names_its_file_and_line(tmp_path: Path):
    chunk = tmp_path / "exp" / "x-001.jsonl.gz"
    chunk.parent.mkdir()
    with gzip.open(chunk, "wt") as fh:
        fh.write('{"run": "a", "files": {}}\nnot json\n')
    with pytest.raises(ValueError, match=r"x-001.jsonl.gz, line 2: not a ledger entry"):
        Ledger(tmp_path).entries("exp")


@pytest.mark.slow
def test_a_frontier_continues_on_a_fresh_machine_from_the_ledger(adult_dir: Path, tmp_path: Path):
    from resfl_lightning.cli.frontier import main

    from .test_frontier import TINY_GRID

    grid = tmp_path / "grid.yaml"
    grid.write_text(TINY_GRID)
    common = ["--dataset", "adult", "--grid", str(grid), "--jobs", "1", "--ledger", str(tmp_path / "ledger"),
              f"dataset.root={adult_dir}", "federation.rounds=1"]
    first, second = tmp_path / "m1" / "frontier", tmp_path / "m2" / "frontier"
    assert main([*common, "--out", str(first)]) == 0
    assert main([*common, "--out", str(second), "--results", str(tmp_path / "results")]) == 0
    # nothing trained on the second machine: every run came from the ledger, with the same values
    assert not list(second.glob("*/table_train.log"))
    def body(path: Path) -> list[str]:  # below the title (timings) and without the provenance list
        provenance = ("- command:", "- commit:", "- date:", "- packages:", "- machine:", "- wall time:", "- ledger:",
                      "- runs trained at:")
        return [line for line in path.read_text().splitlines()[1:] if not line.startswith(provenance)]

    assert body(second / "frontier.md") == body(first / "frontier.md")
    assert "- ledger: 3 of the runs are in" in (tmp_path / "results" / "frontier.md").read_text()


def test_a_command_keeps_only_the_rows_it_reads(tmp_path: Path):
    made = finished(tmp_path / "m1" / "exp" / "fedavg-s3", OVERRIDES, 0.84)
    run_ledger.use(tmp_path / "ledger")
    run_ledger.keep({"metrics.jsonl": ("round", "share")})
    run_ledger.active().record(made, OVERRIDES)
    files = Ledger(tmp_path / "ledger").entries("exp")["fedavg-s3"]["files"]
    assert [json.loads(line) for line in files["metrics.jsonl"].splitlines()] == [{"round": 0, "share": 0.25},
                                                                                 {"round": 1}]
    run_ledger.use(tmp_path / "whole")
    run_ledger.keep({"metrics.jsonl": run_ledger.ALL_KEYS})
    run_ledger.active().record(made, OVERRIDES)
    whole = Ledger(tmp_path / "whole").entries("exp")["fedavg-s3"]["files"]["metrics.jsonl"]
    assert whole == (made / "metrics.jsonl").read_text()


def test_the_commits_runs_were_trained_at_are_counted_and_dirty_ones_marked(tmp_path: Path):
    from resfl_lightning.analysis.provenance import run_commits_line
    from resfl_lightning.analysis.run_records import trained_commits

    runs = []
    for i, commit in enumerate(["a" * 40, "a" * 40, "b" * 40 + " (with uncommitted changes)", None]):
        run = tmp_path / f"r{i}"
        run.mkdir()
        (run / "summary.json").write_text("{}")
        (run / "table_wall_s.json").write_text(json.dumps({"wall_s": 1.0} | ({"commit": commit} if commit else {})))
        runs.append(run)
    (tmp_path / "unfinished").mkdir()
    runs.append(tmp_path / "unfinished")
    assert trained_commits(runs) == ({"aaaaaaaaaaaa": 2, "bbbbbbbbbbbb+dirty": 1}, 1)
    line = run_commits_line(runs)
    assert line.startswith("- runs trained at: aaaaaaaaaaaa (2), bbbbbbbbbbbb+dirty (1); 1 launched before")


def test_a_run_trained_before_a_tuned_file_existed_is_the_run_use_tuned_false_composes(tmp_path: Path):
    """The detection Byzantine subset was trained at the synthetic preset (lr 0.01) before the tune wrote
    conf/tuned/synthetic/fedavg.yaml (lr 0.03): the switch itself is no setting, what it changes is."""
    from resfl_lightning.analysis.run_settings import saved_config_mismatch

    preset = ["dataset=synthetic", "algorithm=fedavg", "seed=0", "run_dir=runs/x"]
    saved = composed_settings([*preset, "use_tuned=false"])
    saved["use_tuned"] = True  # as it was saved: the switch on, no file to apply yet
    text = OmegaConf.to_yaml(OmegaConf.create(saved))
    assert saved_config_mismatch(text, [*preset, "use_tuned=false"]) == []
    now = saved_config_mismatch(text, preset)  # today the tuned file applies
    assert any(line.startswith("optim.lr: ") for line in now) and not any(line.startswith("use_tuned") for line in now)


def test_a_run_saved_before_the_attack_classes_moved_is_not_stale():
    """attack.*._target_ named resfl_lightning.callbacks.* before the attack classes moved to attacks/: a run saved
    then is the run the same overrides compose now; any other change still counts."""
    from resfl_lightning.analysis.run_settings import MOVED_TARGETS, saved_config_mismatch

    overrides = ["dataset=adult", "algorithm=fedavg", "attack=[privacy,byzantine]", "seed=0", "run_dir=runs/x"]
    saved = composed_settings(overrides)
    old_of = {new: old for old, new in MOVED_TARGETS.items()}
    moved = 0
    for node in saved["attack"].values():
        if isinstance(node, dict) and node.get("_target_") in old_of:
            node["_target_"], moved = old_of[node["_target_"]], moved + 1
    assert moved == 5  # mia, aia, update_aia, byzantine, eod
    assert saved_config_mismatch(OmegaConf.to_yaml(OmegaConf.create(saved)), overrides) == []
    saved["attack"]["byzantine"]["_target_"] = "resfl_lightning.callbacks.robustness.Elsewhere"
    assert saved_config_mismatch(OmegaConf.to_yaml(OmegaConf.create(saved)), overrides) == [
        "attack.byzantine._target_: resfl_lightning.callbacks.robustness.Elsewhere -> "
        "resfl_lightning.attacks.robustness_attacks.ByzantineAttack"]


def test_a_run_saved_before_a_key_was_added_matches_only_the_keys_legacy_value():
    """A synthetic run saved before the generator's knobs were exposed drew its scenes as their legacy values do: it
    is the run those values compose now, and not a run composed with another value."""
    from resfl_lightning.analysis.run_settings import ADDED_KEYS, saved_config_mismatch

    preset = ["dataset=synthetic", "algorithm=fedavg", "seed=0", "run_dir=runs/x"]
    saved = composed_settings(preset)
    added = [k for k in ADDED_KEYS if has_key(saved, k)]
    assert "dataset.max_persons" in added and "metrics.min_group_size" in added
    assert {k: value_at(saved, k) for k in added} == {k: ADDED_KEYS[k] for k in added}
    for key in added:
        drop_key(saved, key)
    text = OmegaConf.to_yaml(OmegaConf.create(saved))
    assert saved_config_mismatch(text, preset) == []
    assert saved_config_mismatch(text, [*preset, "dataset.max_persons=6"]) == ["dataset.max_persons: 4 -> 6"]
    adult = composed_settings(["dataset=adult", "algorithm=fedavg", "seed=0", "run_dir=runs/x"])
    assert saved_config_mismatch(OmegaConf.to_yaml(OmegaConf.create(adult)),
                                 ["dataset=adult", "algorithm=fedavg", "seed=0", "run_dir=runs/x"]) == []


def has_key(tree: dict, dotted: str) -> bool:
    *path, leaf = dotted.split(".")
    for part in path:
        tree = tree.get(part, {}) if isinstance(tree, dict) else {}
    return isinstance(tree, dict) and leaf in tree


def value_at(tree: dict, dotted: str):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def drop_key(tree: dict, dotted: str) -> None:
    """Delete a leaf, and the sections it leaves empty (a section added with the key did not exist before)."""
    head, _, rest = dotted.partition(".")
    if rest:
        drop_key(tree[head], rest)
        if not tree[head]:
            del tree[head]
    else:
        del tree[head]


@pytest.mark.parametrize("dataset", [["dataset=adult"], ["dataset=synthetic"],
                                     ["dataset=csv", "dataset.path=people.csv", "dataset.target=y",
                                      "dataset.positive=[1]", "dataset.sensitive=race"]])
def test_runs_saved_before_the_minimum_group_size_keep_every_group_and_are_not_stale(dataset):
    """Issue 58's keys (metrics.min_group_size, dataset.merge_groups_below) compose to the values every published run
    was measured with (every group kept, none merged), so a run saved without them is not stale; one composed with
    another value is another run."""
    from resfl_lightning.analysis.run_settings import ADDED_KEYS, saved_config_mismatch

    overrides = [*dataset, "algorithm=fedavg", "seed=0", "run_dir=runs/x"]
    saved = composed_settings(overrides)
    assert saved["metrics"] == {"min_group_size": 1} == {"min_group_size": ADDED_KEYS["metrics.min_group_size"]}
    drop_key(saved, "metrics.min_group_size")
    assert "metrics" not in saved
    csv = "merge_groups_below" in saved["dataset"]
    assert csv == (dataset[0] == "dataset=csv")  # only the CSV loader's own config lists it
    if csv:
        assert saved["dataset"]["merge_groups_below"] == ADDED_KEYS["dataset.merge_groups_below"] == 0
        drop_key(saved, "dataset.merge_groups_below")
    text = OmegaConf.to_yaml(OmegaConf.create(saved))
    assert saved_config_mismatch(text, overrides) == []
    assert saved_config_mismatch(text, [*overrides, "metrics.min_group_size=30"]) == [
        "metrics.min_group_size: 1 -> 30"]
    if csv:
        assert saved_config_mismatch(text, [*overrides, "dataset.merge_groups_below=50"]) == [
            "dataset.merge_groups_below: 0 -> 50"]


def test_a_tuned_file_a_pin_covers_entirely_is_the_same_run():
    """The Adult robustness runs recorded tuned_file conf/tuned/adult/fedavg.yaml; today its one key (optim.lr) is
    pinned by the grid, so nothing of the file applies and the record is null: the same settings, the same run."""
    from resfl_lightning.analysis.run_settings import saved_config_mismatch

    overrides = ["dataset=adult", "algorithm=fedavg", "optim.lr=0.1", "seed=0", "run_dir=runs/x"]
    saved = composed_settings(overrides)
    saved["tuned_file"] = "conf/tuned/adult/fedavg.yaml"
    assert saved_config_mismatch(OmegaConf.to_yaml(OmegaConf.create(saved)), overrides) == []
    saved["optim"]["lr"] = 0.03
    assert saved_config_mismatch(OmegaConf.to_yaml(OmegaConf.create(saved)), overrides) == ["optim.lr: 0.03 -> 0.1"]


def test_runs_saved_before_the_mia_method_are_the_shadow_attack_and_not_stale():
    """Issue 56's keys (attack.mia.method and the reference-model knobs) compose to the shadow attack every published
    run measured, so a run saved without them is not stale; one composed with lira is another run."""
    from resfl_lightning.analysis.run_settings import ADDED_KEYS, saved_config_mismatch

    keys = ("attack.mia.method", "attack.mia.references", "attack.mia.rmia_gamma", "attack.mia.rmia_offline_a")
    overrides = ["dataset=adult", "algorithm=fedavg", "attack=privacy", "seed=0", "run_dir=runs/x"]
    saved = composed_settings(overrides)
    assert {k: value_at(saved, k) for k in keys} == {k: ADDED_KEYS[k] for k in keys}
    assert ADDED_KEYS["attack.mia.method"] == "shadow"
    for key in keys:
        drop_key(saved, key)
    text = OmegaConf.to_yaml(OmegaConf.create(saved))
    assert saved_config_mismatch(text, overrides) == []
    assert saved_config_mismatch(text, [*overrides, "attack.mia.method=lira"]) == [
        "attack.mia.method: shadow -> lira"]
