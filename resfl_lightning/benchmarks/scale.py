"""`resfl bench scale`: peak RSS and per-step time for 4 / 1,000 / 10,000 virtual clients at 1 % participation on
one process, and the local-training overhead against a plain PyTorch loop over the same batches.

Workload: TabularNet (RESFL: adversary phi and UFM EMA kept per client in the ClientStateStore) on Adult-shaped rows
(105 random features, 5 groups, so no dataset is needed), ROWS_PER_CLIENT = 320 rows a client at every N (288
training rows = 9 full batches of 32, 32 validation rows), split iid by group with the run's own partitioner. Each N
runs in its own process (`python -m resfl_lightning.benchmarks.scale N FRACTION ROUNDS ROWS_PER_CLIENT`, which prints
`child`'s JSON), so its peak RSS is its own.

Why not Adult's 30,162 rows split into N (the earlier workload): at 10,000 clients a client holds 3 rows, so
it has no validation row (its evaluation raises and every client is dropped: the 0.0 s line) and takes one step of
2-3 rows, against 212 steps of 32 rows a client at N = 4; "seconds per step" then compares a client's fixed cost
with a step, not steps. With the same rows a client at every N, every client does the same work, so a per-step or
per-client ratio above 1 is a cost that grows with N. The N x 320 rows are virtual: row v reads row v mod 30,162 of
one Adult-sized table (`VirtualRows`), so the table's 13 MB is the same at every N and the peak RSS shows the
simulator's own per-client memory (split indices: 8 bytes a row, 26 MB at 10,000 clients; client states; anything
kept per client). A run with 3.2 M distinct rows would hold its table too (1.3 GB of float32 features): data, not
simulator overhead, and not what the RSS ratio measures.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from resfl_lightning.benchmarks.goals import goal_verdict

ROWS, FEATURES, GROUPS = 30162, 105, 5
ROWS_PER_CLIENT = 320
TEST_ROWS = 2000
COUNTS, FRACTION = (4, 1000, 10000), 0.01  # the goal's 10,000 clients at 1 % participation, and smaller baselines
# docs/performance.md's scale goal: at 10,000 clients a step at most 1.15x and the peak RSS at most 1.5x those at
# N = 4, i.e. the simulator's cost grows with the clients sampled, not with the clients that exist
GOAL_CLIENTS, STEP_GOAL, RSS_GOAL = 10000, 1.15, 1.5


def _virtual_rows_class() -> type:
    """Built on first use, so importing this module loads neither numpy nor torch (as its other imports)."""
    import numpy as np
    from torch.utils.data import DataLoader

    from resfl_lightning.data.tabular import FederatedTabularData

    class VirtualRows(FederatedTabularData):
        """Split indices over N x rows-a-client virtual rows; virtual row v is row v mod len(x) of the table."""

        def _loader(self, indices: np.ndarray, shuffle: bool, seed: int = 0, train: bool = False,
                    augment: bool = True) -> DataLoader:
            return super()._loader(np.asarray(indices, dtype=np.int64) % self.x.shape[0], shuffle, seed, train,
                                   augment)

    return VirtualRows


def _data(num_clients: int, rows_per_client: int = ROWS_PER_CLIENT):
    """The Adult-sized table and num_clients x rows_per_client virtual rows split iid by group (+ a test split)."""
    import numpy as np
    import torch

    from resfl_lightning.data.partition import make_federated_splits

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    s = rng.integers(0, GROUPS, ROWS)
    y = (x[:, 0] + 0.3 * s > 0.5).astype(np.int64)
    virtual = num_clients * rows_per_client
    part = make_federated_splits(s[np.arange(virtual) % ROWS], num_clients=num_clients, test_fraction=0.0,
                                 reserve_fraction=0.0, val_fraction=0.1, partition="iid", seed=0)
    splits = replace(part, test=np.arange(virtual, virtual + TEST_ROWS, dtype=np.int64))
    return _virtual_rows_class()(x=torch.from_numpy(x), y=torch.from_numpy(y), groups=torch.from_numpy(s),
                                 splits=splits, num_groups=GROUPS, batch_size=32, eval_batch_size=2048)


def _client():
    from resfl_lightning.clients.base import LossWeights, OptimSettings, UfmSettings
    from resfl_lightning.clients.tabular import TabularClient

    return TabularClient(FEATURES, GROUPS, LossWeights(), UfmSettings(gate=None), OptimSettings(lr=0.01))


class _Times:
    """Each round's time/ and round/ metrics, and its wall time (round start to the next round's start or the fit's
    end: local training, validation, reports, aggregation, state commit and checkpoint)."""

    def __init__(self):
        self.rounds: list[dict] = []
        self.starts: list[float] = []
        self.end = 0.0

    def on_round_start(self):
        self.starts.append(time.perf_counter())

    def on_metrics(self, metrics):
        self.rounds.append({k: v for k, v in metrics.items() if k.startswith(("time/", "round/"))})

    def on_fit_end(self):
        self.end = time.perf_counter()

    def walls(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, [*self.starts[1:], self.end])]


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


def child(num_clients: int, fraction: float, rounds: int, rows_per_client: int = ROWS_PER_CLIENT) -> dict:
    """One N: fit `rounds` rounds, measure every round but the first (its one-off warm-ups), check that every sampled
    client trained and was aggregated (a dropped client would leave steps without their time), and return the
    figures with this process's peak RSS."""
    import lightning as L
    import torch

    from resfl_lightning.aggregation.fedavg import FedAvg
    from resfl_lightning.federation.orchestrator import Federation, FederationSettings

    if rounds < 2:
        raise ValueError(f"rounds must be >= 2 (the first is a warm-up), got {rounds}")
    torch.set_num_threads(1)
    data = _data(num_clients, rows_per_client)
    times = _Times()
    with tempfile.TemporaryDirectory() as run_dir:
        fed = Federation(fabric=L.Fabric(accelerator="cpu", devices=1, callbacks=[times]), client_factory=_client,
                         data=data, aggregator=FedAvg(),
                         settings=FederationSettings(rounds=rounds, run_dir=Path(run_dir), clients_per_round=fraction,
                                                     client_state_memory_mb=64))
        fed.fit()
        measured = range(1, rounds)
        for r in measured:
            m, sampled = times.rounds[r], len(fed.participants(r))
            if m["round/aggregated"] != sampled or m["round/dropped"] or m["round/skipped"]:
                raise RuntimeError(f"N={num_clients}, round {r}: {m['round/aggregated']:.0f} of {sampled} sampled "
                                   f"clients aggregated ({m['round/dropped']:.0f} dropped): the line would not "
                                   "measure every sampled client's steps")
        plain = sum(plain_loop_seconds(fed, r)[0] for r in measured)
        stored = len(list((Path(run_dir) / "checkpoints" / "clients").glob("client_*.pt")))
    train = sum(times.rounds[r]["time/train"] for r in measured)
    steps = sum(times.rounds[r]["time/steps"] for r in measured)
    clients = sum(times.rounds[r]["round/aggregated"] for r in measured)
    walls = times.walls()
    return {"clients": num_clients, "sampled": len(fed.participants(rounds - 1)), "rounds": len(measured),
            "steps": steps, "train_s": train, "validate_s": sum(times.rounds[r]["time/validate"] for r in measured),
            "plain_s": plain, "s_per_step": train / steps, "round_s": sum(walls[r] for r in measured),
            "s_per_client": sum(walls[r] for r in measured) / clients, "states_on_disk": stored,
            "peak_rss_mb": peak_rss_mb(), "rows_per_client": rows_per_client}


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: unlike ru_maxrss it does not carry the parent's peak over exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(counts=COUNTS, fraction: float = FRACTION, rounds: int = 3,
            rows_per_client: int = ROWS_PER_CLIENT) -> list[dict]:
    out = []
    for n in counts:
        proc = subprocess.run([sys.executable, "-m", "resfl_lightning.benchmarks.scale", str(n), str(fraction),
                               str(rounds), str(rows_per_client)], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"the N={n} benchmark process failed:\n{proc.stderr[-3000:]}")
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def table(rows: list[dict]):
    from rich.table import Table

    base = rows[0]
    t = Table(title=f"N virtual clients, k sampled per round, one process ({base['rows_per_client']:,} Adult-shaped "
                    f"rows a client, RESFL TabularNet; rounds 2-{base['rounds'] + 1}; 'vs plain' = local-training "
                    "time / the same steps in a plain loop; s/client = round wall time / clients trained)")
    for col in ("N", "k", "steps", "s/step", "vs N=4", "vs plain", "s/client", "vs N=4", "states", "RSS MB",
                "RSS vs N=4", "goal"):
        t.add_column(col, justify="right")
    for r in rows:
        step, rss = r["s_per_step"] / base["s_per_step"], r["peak_rss_mb"] / base["peak_rss_mb"]
        t.add_row(str(r["clients"]), str(r["sampled"]), f"{r['steps']:.0f}", f"{r['s_per_step']:.4f}",
                  f"{step:.2f}x", f"{r['train_s'] / r['plain_s']:.3f}x",
                  f"{r['s_per_client']:.4f}", f"{r['s_per_client'] / base['s_per_client']:.2f}x",
                  str(r["states_on_disk"]), f"{r['peak_rss_mb']:.0f}", f"{rss:.2f}x",
                  scale_goal(r["clients"], step, rss))
    return t


def scale_goal(clients: int, step_ratio: float, rss_ratio: float) -> str:
    """The scale goal's verdict on the 10,000-client row ("-" on the others)."""
    if clients != GOAL_CLIENTS:
        return "-"
    return f"s/step {goal_verdict(step_ratio, STEP_GOAL)}, RSS {goal_verdict(rss_ratio, RSS_GOAL)}"


if __name__ == "__main__":  # one measured process of `measure`
    n, frac, rounds_, rows_ = sys.argv[1:5]  # rows_: rows a client
    print(json.dumps(child(int(n), float(frac), int(rounds_), int(rows_))))
