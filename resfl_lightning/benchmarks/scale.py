"""`resfl bench scale`: peak RSS and per-step time for 4 / 100 / 1,000 virtual clients at 10 % participation on
one process, and the round overhead against a plain PyTorch loop over the same batches.

Workload: TabularNet (RESFL: adversary phi and UFM EMA kept per client in the ClientStateStore) on an Adult-shaped
table (30,162 rows x 105 features, random values, so no dataset is needed); the same rows are split into N clients.
Each N runs in its own process (`python -m resfl_lightning.benchmarks.scale N FRACTION ROUNDS ROWS`, which prints
`child`'s JSON), so its peak RSS is its own.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS, FEATURES, GROUPS = 30162, 105, 5


def _data(num_clients: int, rows: int = ROWS):
    import numpy as np

    from resfl_lightning.data.tabular import federated_tabular_data

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    s = rng.integers(0, GROUPS, rows)
    y = (x[:, 0] + 0.3 * s > 0.5).astype(np.int64)
    splits = {"num_clients": num_clients, "reserve_fraction": 0.0, "val_fraction": 0.1,
              "partition": "iid", "dirichlet_alpha": 0.5, "batch_size": 32, "eval_batch_size": 2048}
    test = min(2000, rows)
    return federated_tabular_data(x, y, s, x[:test], y[:test], s[:test], num_groups=GROUPS, **splits, seed=0)


def _client():
    from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
    from resfl_lightning.clients.tabular import TabularClient

    return TabularClient(FEATURES, GROUPS, LossWeights(), UfmSettings(gate=None), OptimSettings(lr=0.01))


class _Times:
    def __init__(self):
        self.rounds: list[dict] = []

    def on_metrics(self, metrics):
        self.rounds.append({k: v for k, v in metrics.items() if k.startswith(("time/", "round/"))})


def plain_loop_seconds(fed, round_idx: int) -> tuple[float, int]:
    """The round's local steps in a plain PyTorch loop: the same client module, loss, optimiser, lr and clipping, on
    the same batches (the loaders with the clients' round seeds, materialised before the clock starts); no Fabric,
    no federation. One untimed warm-up step first. Returns (seconds, steps)."""
    import torch

    from resfl_lightning.federation.orchestrator import client_seed

    s = fed.settings
    client = fed.client_factory()
    client.train()
    total, steps, warm = 0.0, 0, False
    for cid in fed.participants(round_idx):
        client.begin_client(cid, round_idx)
        opts = [client.configure_optimizers(), *client.local_optimizers()]
        for group in opts[0].param_groups:
            group["lr"] = group["lr"] * s.lr_factor(round_idx)
        clip = client.optim.grad_clip
        seed = client_seed(s.seed, round_idx, cid)
        for epoch in range(s.local_epochs):
            batches = list(fed.data.train_loader(cid, seed=seed + epoch))
            timed = [(True, i, b) for i, b in enumerate(batches)]
            if not warm:
                timed.insert(0, (False, 0, batches[0]))
                warm = True
            for counted, i, batch in timed:
                t0 = time.perf_counter()
                loss = client.training_step(batch, i)
                for o in opts:
                    o.zero_grad(set_to_none=True)
                loss.backward()
                if clip:
                    torch.nn.utils.clip_grad_norm_(client.shared_parameters(), clip)
                for o in opts:
                    o.step()
                if counted:
                    total += time.perf_counter() - t0
                    steps += 1
    return total, steps


def child(num_clients: int, fraction: float, rounds: int, rows: int = ROWS) -> dict:
    import lightning as L
    import torch

    from resfl_lightning.aggregation.fedavg import FedAvg
    from resfl_lightning.federation.orchestrator import Federation, FederationSettings

    torch.set_num_threads(1)
    data = _data(num_clients, rows)
    times = _Times()
    with tempfile.TemporaryDirectory() as run_dir:
        fed = Federation(fabric=L.Fabric(accelerator="cpu", devices=1, callbacks=[times]), client_factory=_client,
                         data=data, aggregator=FedAvg(),
                         settings=FederationSettings(rounds=rounds, run_dir=Path(run_dir), clients_per_round=fraction,
                                                     client_state_memory_mb=64))
        fed.fit()
        sampled = fed.participants(rounds - 1)
        last = times.rounds[-1]
        plain, _ = plain_loop_seconds(fed, rounds - 1)
        stored = len(list((Path(run_dir) / "checkpoints" / "clients").glob("client_*.pt")))
    return {"clients": num_clients, "sampled": len(sampled), "steps": last["time/steps"],
            "train_s": last["time/train"], "validate_s": last["time/validate"], "plain_s": plain,
            "s_per_step": last["time/train"] / max(last["time/steps"], 1), "states_on_disk": stored,
            "peak_rss_mb": peak_rss_mb(), "rows": rows}


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: unlike ru_maxrss it does not carry the parent's peak over exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(counts=(4, 100, 1000), fraction: float = 0.1, rounds: int = 3, rows: int = ROWS) -> list[dict]:
    out = []
    for n in counts:
        proc = subprocess.run([sys.executable, "-m", "resfl_lightning.benchmarks.scale", str(n), str(fraction),
                               str(rounds), str(rows)], capture_output=True, text=True, check=True)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def table(rows: list[dict]):
    from rich.table import Table

    base = rows[0]
    t = Table(title=f"N virtual clients, k sampled per round, one process ({base['rows']:,} Adult-shaped "
                    "rows, RESFL "
                    "TabularNet; last round; 'vs plain' = local-training time / the same steps in a plain loop)")
    for col in ("N", "k", "steps", "s/step", "vs N=4", "vs plain", "states", "RSS MB", "RSS vs N=4"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["clients"]), str(r["sampled"]), f"{r['steps']:.0f}", f"{r['s_per_step']:.4f}",
                  f"{r['s_per_step'] / base['s_per_step']:.2f}x", f"{r['train_s'] / r['plain_s']:.3f}x",
                  str(r["states_on_disk"]), f"{r['peak_rss_mb']:.0f}", f"{r['peak_rss_mb'] / base['peak_rss_mb']:.2f}x")
    return t


if __name__ == "__main__":  # one measured process of `measure`
    n, frac, rounds_, rows_ = sys.argv[1:5]
    print(json.dumps(child(int(n), float(frac), int(rounds_), int(rows_))))
