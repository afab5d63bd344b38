"""`resfl bench round`: one federated FedAvg round of the real entry point against the pure step time of the same
steps in a plain PyTorch loop, `DEVICES=2` against `DEVICES=1`, and the time from process start to the first local
step.

Each measurement is a fresh process, `python -m resfl_lightning.cli.bench_round_child <train overrides>`, which
installs timers (a global optimizer-step hook, a wrapper around Federation.run_round, a timer on the global test
evaluation and a metrics recorder; `instrumented_run` here) and then calls the train entry point (`resfl train`)
unchanged; with fabric.devices=2 Fabric's launcher re-runs the same command for rank 1 (gloo, as
`make train DEVICES=2` does).

Workload: the built-in benchmark (YOLOv8n at 128 px, 4 clients, 720 scenes, batch 16: 8 local steps per client),
FedAvg, one local epoch, 2 rounds; the last round is the one measured (the first warms up). The DEVICES=2 run goes
first, so the scene cache is warm when the DEVICES=1 run measures its time to the first step.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from resfl_lightning.benchmarks.goals import goal_verdict

OUT_ENV, T0_ENV, PLAIN_ENV = "RESFL_BENCH_ROUND_OUT", "RESFL_BENCH_ROUND_T0", "RESFL_BENCH_ROUND_PLAIN"
CHILD_MODULE = "resfl_lightning.cli.bench_round_child"  # instrumented_run around the train entry point
# The speed goals of docs/performance.md: a FedAvg round at most 3 % slower than a plain PyTorch loop over the same
# batches, DEVICES=2 at least 1.8x as fast as DEVICES=1; the first local step and its imports within these seconds
OVERHEAD_TARGET, SPEEDUP_TARGET = 1.03, 1.8
FIRST_STEP_TARGET_S, IMPORTS_TARGET_S = 2.5, 1.5

# Row labels of the printed table (tests/unit/benchmarks/test_bench.py looks them up).
ROW_WALL = "round wall time, DEVICES=1"
ROW_VALIDATE = "  of which client validation for UFM"
ROW_EVAL = "  of which global test evaluation"
ROW_ROUND = "round without validation and test evaluation"
ROW_PLAIN = "plain PyTorch loop: pure step time, same steps and batches"
ROW_OVERHEAD = "round overhead vs plain loop"
ROW_WALL1 = "round wall time without test evaluation, DEVICES=1"
ROW_WALL2 = "round wall time without test evaluation, DEVICES=2"
ROW_SPEEDUP = "DEVICES=2 speed-up vs DEVICES=1"
ROW_FIRST = "time to first local step (process start to first step done)"
ROW_IMPORTS = "  of which interpreter start and imports"
ROWS = (ROW_WALL, ROW_VALIDATE, ROW_EVAL, ROW_ROUND, ROW_PLAIN, ROW_OVERHEAD, ROW_WALL1, ROW_WALL2, ROW_SPEEDUP,
        ROW_FIRST, ROW_IMPORTS)


def train_overrides(quick: bool, rounds: int, run_dir: Path, cache_dir: Path | None) -> list[str]:
    """The train entry point's overrides for the measured workload (quick: a femto detector on 64 scenes of 64 px)."""
    out = ["dataset=synthetic", "algorithm=fedavg", "attack=none", "logger=none", "progress=false",
           "export.enabled=false", "dataset.num_clients=4", "federation.local_epochs=1", f"federation.rounds={rounds}",
           "eval.every=1000", f"run_dir={run_dir}"]
    if quick:
        out += ["model.scale=femto", "dataset.image_size=64", "dataset.num_images=64", "dataset.extra_reserve_images=0",
                "dataset.batch_size=8"]
    else:
        out += ["model.scale=n", "dataset.image_size=128", "dataset.num_images=720", "dataset.batch_size=16"]
    if cache_dir is not None:
        out.append(f"dataset.cache_dir={cache_dir}")
    return out


# --- the measured process ------------------------------------------------------------------------------------------
class _Recorder:
    """A Fabric callback: each round's time/* and round/* metrics."""

    def __init__(self, rounds: dict):
        self.rounds = rounds

    def on_metrics(self, round_idx, metrics):
        self.rounds.setdefault(round_idx, {}).update(
            {k: float(v) for k, v in metrics.items() if k.startswith(("time/", "round/"))})


def instrumented_run(entry: Callable[[], None], out_path: str) -> None:
    """Run the train entry point `entry` under the timers; rank 0 writes the record to `out_path`."""
    t_start = float(os.environ[T0_ENV]) if T0_ENV in os.environ else math.nan
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from resfl_lightning import builders
    from resfl_lightning.callbacks.evaluation import GlobalEvaluation
    from resfl_lightning.federation.orchestrator import Federation

    rec: dict = {"t_start": t_start, "first_step": None, "rounds": {}, "federation": None}

    def on_step(optimizer, args, kwargs):
        if rec["first_step"] is None:
            rec["first_step"] = time.time()

    register_optimizer_step_post_hook(on_step)
    run_round, fit, evaluate = Federation.run_round, Federation.fit, GlobalEvaluation.on_round_end

    def timed_round(self, client, layout, state, round_idx):
        t0 = time.perf_counter()
        out = run_round(self, client, layout, state, round_idx)
        rec["rounds"].setdefault(round_idx, {})["wall"] = time.perf_counter() - t0
        return out

    def timed_eval(self, federation, round_idx, model, metrics):
        t0 = time.perf_counter()
        evaluate(self, federation, round_idx, model, metrics)
        rec["rounds"].setdefault(round_idx, {})["eval"] = time.perf_counter() - t0

    def kept_fit(self):
        rec["federation"] = self
        return fit(self)

    Federation.run_round, Federation.fit, GlobalEvaluation.on_round_end = timed_round, kept_fit, timed_eval
    callbacks = builders.build_callbacks
    builders.build_callbacks = lambda *args: [*callbacks(*args), _Recorder(rec["rounds"])]
    rec["t_main"] = time.time()
    entry()  # the entry point itself: hydra composes the config from sys.argv, then validate, build, fit
    fed = rec.pop("federation")
    if fed is None or fed.fabric.global_rank != 0:
        return
    rec["world"] = fed.fabric.world_size
    last = max(rec["rounds"])
    if PLAIN_ENV in os.environ and os.environ[PLAIN_ENV] == "1":
        from resfl_lightning.benchmarks.scale import plain_loop_seconds

        rec["plain_s"], rec["plain_steps"] = plain_loop_seconds(fed, last)
    rec["rounds"] = {str(k): v for k, v in rec["rounds"].items()}
    Path(out_path).write_text(json.dumps(rec))


# --- the parent: launch, collect, tabulate ---------------------------------------------------------------------------
def run_child(overrides: list[str], out: Path, plain: bool = False, timeout: float = 3600) -> dict:
    env = {**os.environ, OUT_ENV: str(out), PLAIN_ENV: "1" if plain else "0", "PYTHONUNBUFFERED": "1",
           "WANDB_MODE": "offline"}
    env[T0_ENV] = repr(time.time())  # the clock starts before the interpreter does
    proc = subprocess.run([sys.executable, "-m", CHILD_MODULE, *overrides], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(f"bench_round child {' '.join(overrides)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def measure(quick: bool = False, rounds: int = 2, workdir: Path | None = None) -> dict:
    """DEVICES=2 first (it also fills the scene cache), then DEVICES=1 with the plain loop; one dict of figures."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(workdir or tmp)
        cache = base / "cache" if quick else None  # full size: the default cache, shared with `make train`
        two = run_child([*train_overrides(quick, rounds, base / "two", cache), "fabric.devices=2"], base / "two.json")
        one = run_child(train_overrides(quick, rounds, base / "one", cache), base / "one.json", plain=True)
    return summarise(one, two)


def _recorded(record: dict, key: str, absent: float) -> float:
    """A recorded figure; `absent` when the run did not record it (no validation or evaluation in that round)."""
    return record[key] if key in record else absent


def summarise(one: dict, two: dict) -> dict:
    last = str(max(int(k) for k in one["rounds"]))
    r1, r2 = one["rounds"][last], two["rounds"][last]
    validate, evaluation = _recorded(r1, "time/validate", 0.0), _recorded(r1, "eval", 0.0)
    round_s = r1["wall"] - validate - evaluation
    wall1, wall2 = r1["wall"] - evaluation, r2["wall"] - _recorded(r2, "eval", 0.0)
    first = one["first_step"] - one["t_start"] if one["first_step"] else math.nan
    plain_s = _recorded(one, "plain_s", math.nan)  # recorded by the DEVICES=1 run only
    return {"round": int(last), "rounds": len(one["rounds"]), "steps": int(_recorded(r1, "time/steps", 0)),
            "plain_steps": _recorded(one, "plain_steps", 0), "wall": r1["wall"], "validate": validate,
            "eval": evaluation, "round_s": round_s, "plain_s": plain_s,
            "overhead": round_s / plain_s if plain_s else math.nan,
            "wall1": wall1, "wall2": wall2, "speedup": wall1 / wall2, "world2": _recorded(two, "world", 0),
            "first_step_s": first, "imports_s": one["t_main"] - one["t_start"]}


def table(r: dict, title: str = ""):
    from rich.table import Table

    t = Table(title=title or f"federated FedAvg round {r['round'] + 1} of {r['rounds']} through the train entry point "
                             f"({r['steps']} local steps on 4 clients) vs a plain loop; DEVICES=2 vs 1; first step")
    for col in ("measure", "value", "target"):
        t.add_column(col, justify="left" if col != "value" else "right")
    t.add_row(ROW_WALL, f"{r['wall']:.3f} s", "")
    t.add_row(ROW_VALIDATE, f"{r['validate']:.3f} s", "counted separately")
    t.add_row(ROW_EVAL, f"{r['eval']:.3f} s", "counted separately")
    t.add_row(ROW_ROUND, f"{r['round_s']:.3f} s", "")
    t.add_row(ROW_PLAIN, f"{r['plain_s']:.3f} s", f"{r['plain_steps']} steps")
    t.add_row(ROW_OVERHEAD, f"{r['overhead']:.3f}x", goal_verdict(r["overhead"], OVERHEAD_TARGET))
    t.add_row(ROW_WALL1, f"{r['wall1']:.3f} s", "")
    t.add_row(ROW_WALL2, f"{r['wall2']:.3f} s", f"{r['world2']} processes (gloo)")
    t.add_row(ROW_SPEEDUP, f"{r['speedup']:.3f}x", goal_verdict(r["speedup"], SPEEDUP_TARGET, at_most=False))
    t.add_row(ROW_FIRST, f"{r['first_step_s']:.3f} s", goal_verdict(r["first_step_s"], FIRST_STEP_TARGET_S, unit="s"))
    t.add_row(ROW_IMPORTS, f"{r['imports_s']:.3f} s", goal_verdict(r["imports_s"], IMPORTS_TARGET_S, unit="s"))
    return t
