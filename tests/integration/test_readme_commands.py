"""Every documented training command works with every documented dataset option (tiny sizes, one round), and every
other command, Make target, module and link the README shows exists.

The training commands are read from README.md (each `make train ...` and `resfl train ...`, braces expanded) plus
every option of the `algorithm` and `attack` groups and the cohort variants the README names; each runs through the
real entry point (`run(cfg)` on the composed config; DEVICES=2 as a subprocess, since Fabric's ddp launcher re-runs
the command) on the built-in benchmark (mst3, mst10), the FACET and CARLA fixtures (person, class1) and UCI Adult
(race, sex); the dataset variants run the group-dependent commands (attacks, UFM cohorts / labels, partition).
Commands that need a GPU are skipped on CPU with that reason; the README's documented limits (UNSUPPORTED) must stop
with their message.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from resfl_lightning.attacks.byzantine_round import RULE_NEEDS
from resfl_lightning.cli.hydra_help import group_defaults
from resfl_lightning.resources import conf_dir
from tests.fixtures_real import write_carla_fixture, write_facet_fixture
from tests.helpers import compose_config

REPO = Path(__file__).resolve().parents[2]
CONF = conf_dir()
TINY = ["logger=none", "progress=false", "federation.rounds=1", "federation.local_epochs=1",
        "federation.lr_milestones=[]", "dataset.num_clients=2", "eval.every=1", "seed=0"]
TINY_DETECTION = ["model.scale=femto", "dataset.image_size=64", "dataset.batch_size=8"]
MAKE_VARS = {"DATASET": "dataset", "ALGO": "algorithm", "DEVICES": "fabric.devices"}
GROUP_DEPENDENT = ("attack=", "ufm.", "dataset.partition=")  # also swept over the dataset variants


def expand_braces(text: str) -> list[str]:
    """Shell brace expansion of `{a,b}` groups (the README's ranges of seeds / options)."""
    parts = re.split(r"(\{[^{}]*,[^{}]*\})", text)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def readme_text() -> str:
    return (REPO / "README.md").read_text()


def code_blocks(text: str) -> list[str]:
    """The README's fenced code blocks: the commands it shows to be run as they stand."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)


def inline_code(text: str) -> list[str]:
    """The README's inline code spans outside fenced blocks."""
    return re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))


def readme_commands() -> list[tuple[str, list[str]]]:
    """(command text, Hydra overrides) of every `make train` (Makefile variables mapped to keys) and every
    `resfl train` with overrides in a code block (one with a flag such as --cfg or -m is not a training command)."""
    found = []
    text = readme_text()
    for match in re.finditer(r"make train\b([^`#\n]*)", text):
        for line in expand_braces(match.group(1).strip()):
            overrides = []
            for token in shlex.split(line):
                key, _, value = token.partition("=")
                if key == "ARGS":
                    overrides += shlex.split(value)
                elif key in MAKE_VARS:
                    overrides.append(f"{MAKE_VARS[key]}={value}")
                else:
                    raise AssertionError(f"README: unknown make variable in `make train {line}`")
            found.append((f"make train {line}".strip(), overrides))
    for match in re.finditer(r"resfl train\b([^`#\n]*)", "\n".join(code_blocks(text))):
        for line in expand_braces(match.group(1).strip()):
            tokens = shlex.split(line)
            if tokens and not any(t.startswith("-") for t in tokens):
                assert all("=" in t for t in tokens), f"README: `resfl train {line}` has a token that is no override"
                found.append((f"resfl train {line}", tokens))
    return found


def documented_commands() -> list[tuple[str, list[str]]]:
    cmds = readme_commands()
    defaults = group_defaults(CONF)
    for group in ("algorithm", "attack"):  # every option (the default one is `make train` itself)
        cmds += [(f"{group}={p.stem}", [f"{group}={p.stem}"]) for p in sorted((CONF / group).glob("*.yaml"))
                 if p.stem != defaults[group]]
    cmds += [(f"ufm.cohorts={c}", [f"ufm.cohorts={c}"]) for c in ("slices", "proxy")]  # "(also slices, proxy)"
    cmds += [(f"{a} algorithm=resfl_robust", [a, "algorithm=resfl_robust"]) for a in NEEDS_RESFL_ROBUST]
    unique: dict[tuple[str, ...], str] = {}
    for text, overrides in cmds:
        unique.setdefault(tuple(overrides), text)
    return [(text, list(o)) for o, text in unique.items()]


DATASETS = {  # option name -> overrides (the fixture roots are filled in by the `roots` fixture)
    "synthetic": ["dataset=synthetic", "dataset.num_images=64", "dataset.extra_reserve_images=32"],
    "synthetic-mst10": ["dataset=synthetic", "dataset.num_images=64", "dataset.extra_reserve_images=32",
                        "dataset.grouping=mst10"],
    # tiny fixture: 5 % of its 80 images would leave the MIA fewer than 6 images per reserve split
    "facet": ["dataset=facet", "dataset.root={facet}", "dataset.reserve_fraction=0.25"],
    "facet-class1": ["dataset=facet", "dataset.root={facet}", "dataset.reserve_fraction=0.25",
                     "dataset.classes=class1"],
    "carla": ["dataset=carla", "dataset.root={carla}"],
    "adult": ["dataset=adult", "dataset.root={adult}"],
    "adult-sex": ["dataset=adult", "dataset.root={adult}", "dataset.sensitive=sex"],
}
BASE = ("synthetic", "facet", "carla", "adult")
# The adaptive kinds that read resfl_robust's own parameters ("against resfl_robust's own rule").
NEEDS_RESFL_ROBUST = tuple(f"attack=byzantine_{kind}" for kind in RULE_NEEDS)
# Documented limits (README): Adult has no images to corrupt and no proxy column, the adaptive kinds above attack
# resfl_robust only; the run must stop with this message.
UNSUPPORTED = (("eval.weather=true", "adult", "weather corruptions apply to image detection datasets"),
               ("ufm.cohorts=proxy", "adult", "needs a proxy column"),
               *(("attack=byzantine_label_flip", d, "needs class labels of a tabular dataset")
                 for d in ("synthetic", "facet", "carla")),
               *((a, "", "use algorithm=resfl_robust") for a in NEEDS_RESFL_ROBUST))


def unsupported(command: list[str], option: str) -> list[str]:
    """The messages the documented limits expect of this command on this dataset option (none: it must run)."""
    robust = "algorithm=resfl_robust" in command
    return [msg for o, d, msg in UNSUPPORTED
            if o in command and option.startswith(d) and not (robust and o in NEEDS_RESFL_ROBUST)]


def _effective(overrides: list[str]) -> frozenset:
    """The override set as the composed config sees it (last value wins); the seed does not change the code path."""
    eff = {}
    for o in overrides:
        key, _, value = o.partition("=")
        eff[key] = value
    eff.pop("seed", None)
    return frozenset(eff.items())


def cases():
    seen = set()
    for (text, overrides), option in itertools.product(documented_commands(), DATASETS):
        named = [o.split("=", 1)[1] for o in overrides if o.startswith("dataset=")]
        if named and DATASETS[option][0] != f"dataset={named[0]}":
            continue  # the command names its own dataset: only that dataset's options
        if option not in BASE and not any(o.startswith(GROUP_DEPENDENT) for o in overrides):
            continue
        key = _effective([*DATASETS[option], *command_overrides(overrides)])
        if key in seen:
            continue
        seen.add(key)
        yield pytest.param(overrides, option, id=f"{text} | {option}")


def command_overrides(command: list[str]) -> list[str]:
    """The command's overrides minus its dataset choice and data path (the sweep supplies the fixtures)."""
    return [o for o in command if not o.startswith(("dataset=", "dataset.root="))]


@pytest.fixture(scope="module")
def roots(tmp_path_factory, adult_dir: Path) -> dict[str, str]:
    base = tmp_path_factory.mktemp("datasets")
    write_facet_fixture(base / "facet", n_images=80)
    write_carla_fixture(base / "carla", n_finetune=80, n_eval=78, n_attack=24)  # 6 frames per weather condition
    return {"facet": str(base / "facet"), "carla": str(base / "carla"), "adult": str(adult_dir),
            "cache": str(base / "synthetic-cache")}  # the benchmark's scenes, generated once for the module


def final_overrides(command: list[str], option: str, roots: dict[str, str], run_dir: Path) -> list[str]:
    data = [o.format(**roots) for o in DATASETS[option]]
    extra = [f"dataset.cache_dir={roots['cache']}"] if option.startswith("synthetic") else []
    detection = TINY_DETECTION if not option.startswith("adult") else []
    return [*data, *TINY, *detection, *extra, *command_overrides(command), f"run_dir={run_dir}"]


@pytest.mark.slow
@pytest.mark.parametrize(("command", "option"), list(cases()))
def test_documented_command_runs(command: list[str], option: str, roots: dict[str, str], tmp_path: Path):
    if any(o in ("fabric=gpu",) for o in command):
        pytest.skip("needs a GPU (fabric=gpu)")
    run_dir = tmp_path / "run"
    overrides = final_overrides(command, option, roots, run_dir)
    devices = [o for o in overrides if o.startswith("fabric.devices=")]
    if devices and devices[-1] != "fabric.devices=1":
        env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-m", "resfl_lightning.train", *overrides], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
    else:
        from resfl_lightning.train import run

        expected = unsupported(command, option)
        if expected:
            with pytest.raises(ValueError, match=expected[0]):
                run(compose_config(*overrides))
            return
        run(compose_config(*overrides))
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 1 and (run_dir / "summary.json").is_file()
    if not option.startswith("adult"):
        assert (run_dir / "export" / "global.pt").is_file()


def test_readme_commands_are_parsed():
    """The parser sees the README's commands (a renamed variable or a broken line would silently shrink the sweep)."""
    cmds = dict(readme_commands())
    assert cmds["make train"] == [] and cmds["make train ALGO=fedavg"] == ["algorithm=fedavg"]
    adult = ["dataset=adult", "algorithm=resfl", "dataset.root=<adult>", "dataset.sensitive=sex", "attack=privacy",
             "algorithm.lambda_priv=1.0", "seed=2"]
    assert adult in cmds.values()  # braces expanded
    assert ["dataset=adult", "dataset.root=<adult>", "dataset.sensitive=sex"] in cmds.values()  # a `resfl train`
    assert len(list(cases())) >= 60


def test_readme_is_short():
    """The README stays a page of usage (the method and the design live in docs/)."""
    assert len(readme_text().splitlines()) <= 300


def test_readme_links_exist():
    links = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", readme_text())]
    missing = [link for link in links if link and not link.startswith(("http://", "https://"))
               and not (REPO / link).exists()]
    assert links and not missing, f"README links to missing files: {missing}"


def test_readme_make_targets_exist():
    """Every `make <target>` the README shows is a target of the Makefile."""
    targets = set(re.findall(r"^([A-Za-z][\w-]*)\s*:", (REPO / "Makefile").read_text(), flags=re.M))
    shown = set(re.findall(r"\bmake ([a-z][\w-]*)", "\n".join(code_blocks(readme_text()) + inline_code(readme_text()))))
    assert {"train", "test", "table"} <= shown
    assert shown <= targets, f"README shows make targets the Makefile lacks: {sorted(shown - targets)}"


def test_readme_modules_exist():
    """Every `-m resfl_lightning...` module the README's code blocks run can be found."""
    import importlib.util

    modules = set(re.findall(r"-m (resfl_lightning[\w.]*)", "\n".join(code_blocks(readme_text()))))
    assert "resfl_lightning.train" in modules
    missing = [m for m in sorted(modules) if importlib.util.find_spec(m) is None]
    assert not missing, f"README runs modules that do not exist: {missing}"


def test_readme_shows_every_resfl_command():
    """The `resfl <command>`s the README shows are the CLI's commands, and it shows each of them."""
    from resfl_lightning.cli import COMMANDS

    text = readme_text()
    shown = set(re.findall(r"\bresfl ([a-z][\w-]*)", "\n".join(code_blocks(text) + inline_code(text))))
    assert shown - set(COMMANDS) == set(), f"README shows commands `resfl` lacks: {sorted(shown - set(COMMANDS))}"
    assert set(COMMANDS) - shown == set(), f"README leaves out commands: {sorted(set(COMMANDS) - shown)}"


def own_data_steps() -> dict[str, list[str]]:
    """The `resfl <command>` lines of the README's own-data code block (continuations joined): command -> arguments."""
    section = readme_text().split("## Your own data", 1)[1].split("\n## ", 1)[0]
    lines = code_blocks(section)[0].replace("\\\n", " ").splitlines()
    return {shlex.split(line)[1]: shlex.split(line)[2:] for line in lines if line.startswith("resfl ")}


def test_readme_own_data_steps_run_on_a_generated_csv(tmp_path, monkeypatch, capsys):
    """The three steps (look, train, compare) on the small CSV tests/helpers.py writes, as the README shows them:
    `resfl data` reports the file's groups, `resfl train` trains one round with the group named by value and keeps
    the name in its config, and `resfl table` composes the same dataset config as the run."""
    import json

    import pandas as pd
    from omegaconf import OmegaConf

    from resfl_lightning import cli
    from resfl_lightning.analysis.run_settings import composed_settings
    from resfl_lightning.cli.table import parse_args
    from resfl_lightning.train import run
    from tests.helpers import write_loans

    steps = own_data_steps()
    assert list(steps) == ["data", "train", "table"]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RESFL_CACHE_DIR", str(tmp_path / "cache"))
    write_loans(tmp_path / "loans.csv", n=2000)  # 400 rows would leave the table's privacy attacks too small a reserve
    assert cli.main(["data", "--json", *steps["data"]]) == 0
    facts = json.loads(capsys.readouterr().out)
    frame = pd.read_csv(tmp_path / "loans.csv")
    assert facts["group_names"] == sorted(frame["race"].unique())
    assert sum(r["items"] for r in facts["splits"] if r["client"] is None) == len(frame)
    run_dir = tmp_path / "run"
    run(compose_config(*steps["train"], "logger=none", "progress=false", "federation.rounds=1", f"run_dir={run_dir}"))
    assert (run_dir / "summary.json").is_file()
    assert OmegaConf.load(run_dir / "config.yaml").dataset.protected_group == "Black"
    table = parse_args(steps["table"])
    assert table.dataset == "csv"
    assert composed_settings([f"dataset={table.dataset}", *table.overrides])["dataset"] == \
        composed_settings(steps["train"])["dataset"]
