"""Finished runs carried from one machine to the next (`--ledger DIR` of the experiment commands).

An experiment of thousands of runs outlives one machine: the runs' folders stay behind, and the next machine would
train them again. The ledger keeps the small files the commands read from a finished run (FILES: never checkpoints)
in gzipped JSON-lines chunks, DIR/<experiment folder name>/<stamp>-<k>.jsonl.gz, written as runs finish and meant to
be committed. Among them is the run's config.yaml: the resolved config it saved when it started, i.e. the settings it
was trained with. On the next machine the same command restores each run it lacks from the ledger only when that
saved config is what the command composes now, key by key (analysis/run_settings.py, composed once per grid cell),
exactly as it checks its own finished runs: a run whose settings changed is trained again, never reused. Each entry
records the commit, date and machine at which it was recorded (when the run finished, or when a command with the
ledger first found it finished), the commit marked when the tree had uncommitted changes; the results header names
those commits for every run of the command the ledger holds, restored or not, since a grid's runs are often made
over several sessions. An entry holds no machine's paths (analysis/portable_paths.py): its data root is a placeholder,
put back as the restoring command gives it, so that the restored config is what that command composes.
"""

from __future__ import annotations

import datetime
import gzip
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from resfl_lightning.analysis.checkout import DIRTY_MARK, commit_label, kernel_label
from resfl_lightning.analysis.portable_paths import given_roots, localised, portable, run_roots

# What every experiment command reads from a finished run (its settings, final values and wall time); a command
# that reads more names it with `keep` (the table: every per-round row and the Hydra config; the robustness table:
# two per-round keys). metrics.jsonl holds ~10 KB a round of per-client rows, too much to carry for thousands of runs.
FILES = ("config.yaml", "summary.json", "table_wall_s.json")
ALL_KEYS = None  # keep a JSON-lines file whole
CHUNK_RUNS = 100  # entries per chunk: each chunk is rewritten whole as it grows, then left as it is


def _settings(overrides: list[str]) -> list[str]:
    """The overrides that are settings of the run (not where it lives or whether it resumed)."""
    return [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in ("run_dir", "resume")]


def _rows_with(keys: tuple[str, ...] | None, text: str) -> str:
    """The JSON-lines `text` with each row cut to `keys` (all of it for None); rows left empty are dropped."""
    if keys is None:
        return text
    rows = (json.loads(line) for line in text.splitlines() if line.strip())
    kept = ({k: row[k] for k in keys if k in row} for row in rows)
    return "".join(json.dumps(row) + "\n" for row in kept if row)


def _with_texts(entry: dict, change) -> dict:
    """`entry` with `change` applied to the text of each of its files and overrides."""
    return {**entry, "files": {name: change(text) for name, text in entry["files"].items()},
            "overrides": [change(o) for o in entry.get("overrides", [])]}


def portable_entry(entry: dict) -> dict:
    """The entry as the ledger keeps it: its data roots as placeholders, paths in the checkout relative to it."""
    roots = run_roots(entry.get("overrides", []), entry["files"].get("config.yaml"))
    return _with_texts(entry, lambda text: portable(text, roots))


def localised_entry(entry: dict, overrides: list[str]) -> dict:
    """The entry as a command with `overrides` restores it: its placeholders replaced by the data roots the command
    gives. An entry recorded with absolute roots (before entries were portable) is made portable first."""
    roots = given_roots(overrides)
    return _with_texts(portable_entry(entry), lambda text: localised(text, roots))


def _write_chunk(path: Path, lines: list[str]) -> None:
    """Replace the chunk `path` atomically; the same entries give the same bytes (no time or file name in the gzip
    header), so rewriting a chunk unchanged leaves nothing to commit."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9,
                                                   mtime=0) as fh:
        fh.write("".join(lines).encode("utf-8"))
    os.replace(partial, path)


def _chunk_entries(chunk: Path) -> list[dict]:
    """The entries of one chunk, in order; a line that is not an entry names the chunk and line."""
    entries = []
    with gzip.open(chunk, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            try:
                entry = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{chunk}, line {n}: not a ledger entry ({err})") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("run"), str):
                raise ValueError(f"{chunk}, line {n}: not a ledger entry (no run name)")
            entries.append(entry)
    return entries


@dataclass
class Ledger:
    root: Path
    stamp: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}")
    extra: dict[str, tuple[str, ...] | None] = field(default_factory=dict)  # file -> its row keys kept (None: all)
    restored: list[dict] = field(default_factory=list)  # the entries restored by this process (for provenance)
    synced: dict[str, set[Path]] = field(default_factory=dict)  # experiment -> the run folders of the synced jobs
    _recorded: dict[str, list[dict]] = field(default_factory=dict)  # experiment -> entries this process recorded

    def entries(self, experiment: str) -> dict[str, dict]:
        """run name -> its newest entry, over every chunk of the experiment (later chunk names win)."""
        return {entry["run"]: entry for chunk in sorted((self.root / experiment).glob("*.jsonl.gz"))
                for entry in _chunk_entries(chunk)}

    def record(self, run_dir: Path, overrides: list[str]) -> None:
        """Add the finished run in `run_dir` (trained with `overrides`) to this process's open chunk of its
        experiment (rewritten whole)."""
        from resfl_lightning.analysis.checkout import git_commit, lock_hash, machine

        experiment = run_dir.parent.name
        files = {name: (run_dir / name).read_text() for name in FILES if (run_dir / name).is_file()}
        for name, keys in self.extra.items():
            if (run_dir / name).is_file():
                files[name] = _rows_with(keys, (run_dir / name).read_text())
        entry = portable_entry({"run": run_dir.name, "files": files, "overrides": _settings(overrides),
                                "commit": git_commit(), "lock": lock_hash(), "machine": machine(),
                                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
        recorded = self._recorded.setdefault(experiment, [])
        recorded.append(entry)
        index = (len(recorded) - 1) // CHUNK_RUNS  # this process's chunks of the experiment hold CHUNK_RUNS each
        chunk = recorded[index * CHUNK_RUNS:]
        path = self.root / experiment / f"{self.stamp}-{index + 1:03d}.jsonl.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_chunk(path, [json.dumps(e, sort_keys=True) + "\n" for e in chunk])

    def sync(self, jobs: list[tuple[Path, list[str]]], report=print) -> None:
        """Restore the jobs' runs this machine lacks from the ledger (kept only when their saved settings are what
        the jobs compose now), and record the jobs' finished runs the ledger lacks."""
        from resfl_lightning.analysis.run_records import is_finished
        from resfl_lightning.analysis.run_settings import saved_config_mismatch

        known: dict[str, dict[str, dict]] = {}
        stale = []
        for run_dir, overrides in jobs:
            self.synced.setdefault(run_dir.parent.name, set()).add(run_dir)
            if run_dir.parent.name not in known:  # each experiment's chunks read once, not once per job
                known[run_dir.parent.name] = self.entries(run_dir.parent.name)
            entries = known[run_dir.parent.name]
            entry = entries.get(run_dir.name)
            if is_finished(run_dir):
                if entry is None:
                    self.record(run_dir, overrides)
                continue
            files = localised_entry(entry, overrides)["files"] if entry is not None else {}  # this machine's root
            if "summary.json" not in files or "config.yaml" not in files:
                continue
            # the settings it was trained with against those it gets now (never a stamp of when it was recorded);
            # checked before anything is written: an unfinished attempt of the run on this machine stays as it was
            differs = saved_config_mismatch(files["config.yaml"], overrides)  # no workers yet: no lock
            if differs:  # made with other settings: train it again
                stale.append(f"{run_dir.name}: {differs[0]}")
                continue
            for name, text in files.items():
                (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (run_dir / name).write_text(text)
            self.restored.append(entry)
        if self.restored or stale:
            report(f"ledger {self.root}: {len(self.restored)} finished runs restored"
                   + (f", {len(stale)} not (made with other settings; trained again): " + "; ".join(stale[:3])
                      if stale else ""))

    def provenance(self) -> str | None:
        """The results header's line on where the command's runs were recorded: each synced run whose summary here is
        the ledger's entry of it (restored from it, or recorded by this or an earlier command); None when none is."""
        held = []
        for experiment, run_dirs in sorted(self.synced.items()):
            entries = self.entries(experiment)
            for run_dir in sorted(run_dirs):  # a set's order follows the hash seed; dates tie within a second
                entry, summary = entries.get(run_dir.name), run_dir / "summary.json"
                if entry and summary.is_file() and entry["files"].get("summary.json") == summary.read_text():
                    held.append(entry)
        if not held:
            return None
        held.sort(key=lambda e: e["date"])  # a Counter keeps first-seen order: the commits in time order
        counts = Counter(commit_label(e["commit"]) for e in held)
        commits = ", ".join(f"{c} ({n})" for c, n in counts.items())
        dirty = sum(n for c, n in counts.items() if c.endswith(DIRTY_MARK))
        dates = [e["date"] for e in held]
        machines = ", ".join(f"{m} ({n})" for m, n in Counter(kernel_label(e.get("machine", "")) for e in held).items())
        return (f"- ledger: {len(held)} of the runs are in {portable(str(self.root))} ({len(self.restored)} restored "
                f"from it by this command), recorded {dates[0][:10]} to {dates[-1][:10]} at commits (runs) {commits} "
                f"on (runs) {machines}: "
                "a run is recorded when it finishes, or when a command with this ledger first finds it finished"
                + (f"; {dirty} of them were recorded from a tree with uncommitted changes ({DIRTY_MARK})" if dirty
                   else ""))


@dataclass(frozen=True)
class ExperimentSummary:
    experiment: str
    runs: int          # distinct runs (the newest entry of a run counts)
    chunks: int
    commits: tuple[str, ...]
    first: str         # dates of the oldest and newest entries
    last: str


def summarise(root: Path) -> list[ExperimentSummary]:
    """What a ledger holds, one line per experiment folder."""
    out = []
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        entries = Ledger(Path(root)).entries(folder.name)
        if not entries:
            continue
        dates = sorted(e.get("date", "") for e in entries.values())
        commits = tuple(sorted({commit_label(e.get("commit", "?")) for e in entries.values()}))
        out.append(ExperimentSummary(folder.name, len(entries), len(list(folder.glob("*.jsonl.gz"))), commits,
                                     dates[0], dates[-1]))
    return out


def drop(root: Path, experiment: str, pattern: str) -> list[str]:
    """Remove every entry of `experiment` whose run name matches the glob `pattern` (each chunk rewritten atomically,
    a chunk left empty deleted); returns the names dropped. For runs recorded with a defect that a later fix
    corrects in what they logged: the next command with the ledger trains them again, provided their folders are
    gone from the machine it runs on (a finished folder is recorded again). Run it while no command writes to the
    ledger: a running one rewrites its open chunk from memory, with the entries it recorded."""
    import fnmatch

    folder = Path(root) / experiment
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such experiment in the ledger")
    dropped: list[str] = []
    for chunk in sorted(folder.glob("*.jsonl.gz")):
        rows = [(entry["run"], json.dumps(entry, sort_keys=True) + "\n") for entry in _chunk_entries(chunk)]
        kept = [line for name, line in rows if not fnmatch.fnmatchcase(name, pattern)]
        if len(kept) == len(rows):
            continue
        dropped += [name for name, _ in rows if fnmatch.fnmatchcase(name, pattern)]
        if not kept:
            chunk.unlink()
            continue
        _write_chunk(chunk, kept)
    return sorted(set(dropped))


def make_portable(root: Path) -> tuple[int, int]:
    """Rewrite the chunks under `root` whose entries hold machine paths (recorded before entries were portable) with
    portable entries in the same order; returns (entries changed, chunks rewritten). Run it while no command writes
    to the ledger, with the checkout the entries were recorded in (its paths are the ones made relative)."""
    changed = rewritten = 0
    for chunk in sorted(Path(root).rglob("*.jsonl.gz")):
        entries = _chunk_entries(chunk)
        moved = [portable_entry(entry) for entry in entries]
        n = sum(a != b for a, b in zip(entries, moved))
        if n:
            _write_chunk(chunk, [json.dumps(e, sort_keys=True) + "\n" for e in moved])
            changed, rewritten = changed + n, rewritten + 1
    return changed, rewritten


_ACTIVE: Ledger | None = None


def use(root: Path | None) -> None:
    """Make `root` the ledger of this process's experiment command (None: no ledger); set by the commands' parser."""
    global _ACTIVE
    _ACTIVE = None if root is None else Ledger(Path(root))


def active() -> Ledger | None:
    return _ACTIVE


def carried(out: Path, name: str) -> Path | None:
    """Where the active ledger carries the experiment-level file `name` of the experiment folder `out` (a file of
    the experiment, not of one run, that its runs' settings depend on: tune's frozen bases); None without a ledger.
    Entries live in *.jsonl.gz beside it, so nothing else reads it."""
    return None if _ACTIVE is None else _ACTIVE.root / Path(out).name / name


def keep(files: dict[str, tuple[str, ...] | None]) -> None:
    """What this command reads from a finished run beyond FILES (file -> its JSON-lines keys, None for the whole
    file), so that the active ledger carries it; nothing without a ledger."""
    if _ACTIVE is not None:
        _ACTIVE.extra.update(files)
