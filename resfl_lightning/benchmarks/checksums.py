"""Checksums of three small pinned runs' final global models: a fresh install of requirements.lock trains them bit
for bit the same, so equal checksums on two clones on one machine (or two machines with the same CPU model: another
CPU's math kernels round differently, docs/design.md "Invariants") show the environment and the code reproduce a run
exactly; a different checksum names the run that diverged.

    python -m resfl_lightning.benchmarks.checksums [--adult-root PATH] [--out DIR] [--runs NAME ...]

prints one line per run: its name, the sha256 of its final global model and its wall time. The runs: RESFL and FedAvg
on the built-in synthetic detection benchmark at the integration tests' tiny size, and FedAvg on UCI Adult for two
rounds (--adult-root, else $ADULT_ROOT: the folder with adult.data and adult.test). CPU, one process, one thread.

The checksum is over the tensors of run_dir/checkpoints/last.pt that make up the model (the global parameters and
float buffers, the SWA average in their place once SWA has started, the integer buffers), not over the file: the
file also holds the RNG state and the logger's run id, and export/global.pt holds ultralytics' save date.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from resfl_lightning.digest import state_sha256
from resfl_lightning.federation.checkpoint import load_checkpoint

# Every key that changes the bits is on the command line (use_tuned=false: a re-tuned conf/tuned/ file must not move
# a pinned run); threads_per_process=1 because the reduction order of a multi-threaded kernel depends on the split.
COMMON = ["logger=none", "progress=false", "use_tuned=false", "seed=0", "fabric=cpu", "fabric.devices=1",
          "fabric.threads_per_process=1"]
# tests/integration/test_train_end_to_end.py's tiny detection run
TINY = ["dataset=synthetic", "model.scale=femto", "dataset.num_images=64", "dataset.num_clients=2",
        "dataset.batch_size=8", "federation.rounds=2", "eval.every=1", "optim.lr=0.01"]
ADULT = ["dataset=adult", "federation.rounds=2", "eval.every=1"]
RUNS = {
    "tiny-resfl": [*TINY, "algorithm=resfl"],
    "tiny-fedavg": [*TINY, "algorithm=fedavg"],
    "adult-fedavg": [*ADULT, "algorithm=fedavg"],
}


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model a finished run evaluates and exports, as tensors read from its last checkpoint."""
    state = load_checkpoint(Path(run_dir) / "checkpoints" / "last.pt", restore_rng=False)
    return {"theta": state.model_theta, **{f"int_buffers/{k}": v for k, v in state.int_buffers.items()}}


def train(name: str, overrides: list[str], out: Path) -> tuple[str, float]:
    """Train one run in out/<name>; (checksum of its final model, wall seconds)."""
    run_dir = out / name
    cmd = [sys.executable, "-m", "resfl_lightning.train", *COMMON, *overrides, f"run_dir={run_dir}"]
    env = {**os.environ, "WANDB_MODE": "offline", "YOLO_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    return state_sha256(final_model(run_dir)), wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m resfl_lightning.benchmarks.checksums", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adult-root", type=Path, default=os.environ.get("ADULT_ROOT"),
                   help="folder with adult.data and adult.test (default: $ADULT_ROOT)")
    p.add_argument("--out", type=Path, default=Path("runs/checksums"), help="parent of the run directories")
    p.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS), help="a subset (default: all)")
    args = p.parse_args(argv)
    if "adult-fedavg" in args.runs and (args.adult_root is None or not (args.adult_root / "adult.data").is_file()):
        p.error("adult-fedavg needs --adult-root (or $ADULT_ROOT): a folder with adult.data and adult.test")
    for name in args.runs:
        overrides = RUNS[name] + ([f"dataset.root={args.adult_root.resolve()}"] if name.startswith("adult") else [])
        digest, wall = train(name, overrides, args.out.resolve())
        print(f"{name:<13} {digest}  {wall:6.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
