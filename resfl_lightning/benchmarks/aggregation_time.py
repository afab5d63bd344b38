"""`resfl bench aggregation`: each aggregation rule's server time per round on N stacked updates of a model's size
(YOLOv8n by default), for N = 10 and 100 clients.

Streaming rules are timed as the orchestrator runs them (one float64 fold per client); gather-all rules as
`rule.aggregate(deltas[N, P], reports)` on random float32 updates. FLTrust and resfl_robust are given a precomputed
root update and root evaluations, so their time excludes the server's root training and its N root evaluations
(they depend on the dataset, not on N x |theta|). The time a real round also spends gathering the updates (the
all_gather of N x |theta| floats across ranks) is not included. f for the rules that need it: Krum / Multi-Krum
and trimmed mean (beta = f/n) take f = max(1, floor(0.2 n)), Bulyan the largest f with n >= 4f + 3 up to that.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from resfl_lightning.aggregation.base import AggregationRule, GatherAllRule
from resfl_lightning.aggregation.bulyan import Bulyan
from resfl_lightning.aggregation.centered_clipping import CenteredClipping
from resfl_lightning.aggregation.fedavg import FedAvg
from resfl_lightning.aggregation.flame import Flame
from resfl_lightning.aggregation.fltrust import FLTrust
from resfl_lightning.aggregation.krum import Krum
from resfl_lightning.aggregation.median import CoordinateMedian
from resfl_lightning.aggregation.norm_bounding import NormBounding
from resfl_lightning.aggregation.resfl_robust import RobustResfl
from resfl_lightning.aggregation.streaming import StreamingWeightedSum
from resfl_lightning.aggregation.trimmed_mean import TrimmedMean
from resfl_lightning.aggregation.ufm_softmax import UfmSoftmax
from resfl_lightning.types import ClientReport


@dataclass(frozen=True)
class AggregationTime:
    rule: str
    clients: int
    seconds: float
    memory: str  # what the rule holds beyond the model: O(|theta|) or N x |theta|


class _FixedRoot:
    """A root whose update and evaluations are already known (the benchmark times the aggregation alone)."""

    def __init__(self, update: torch.Tensor):
        self._update = update

    def update(self) -> torch.Tensor:
        return self._update

    def evaluate(self, delta: torch.Tensor):
        return SimpleNamespace(ufm_raw=0.5, utility=0.8, ufm_se=0.05)


def _reports(n: int) -> list[ClientReport]:
    return [ClientReport(client_id=i, num_samples=100 + i, ufm_raw=0.1 * i, ufm_ema=0.1 * i, u=0.1 * i, gated=False,
                         val_utility=0.8, val_utility50=0.8, eval_loss=1.0) for i in range(n)]


def rules(n: int, numel: int) -> dict[str, Callable[[], AggregationRule]]:
    """Every rule of conf/aggregation/ (but FairFed / CurvFed, streaming like FedAvg) set up for n clients."""
    f = max(1, math.floor(0.2 * n))
    bulyan_f = max(0, min(f, (n - 3) // 4))
    state = SimpleNamespace(theta=torch.zeros(numel), extra={})

    def fltrust():
        rule = FLTrust()
        rule.root = _FixedRoot(torch.randn(numel, generator=torch.Generator().manual_seed(1)))
        return rule

    def robust():
        rule = RobustResfl(f=f)
        rule.root = _FixedRoot(torch.randn(numel, generator=torch.Generator().manual_seed(1)))
        return rule

    def flame():
        rule = Flame()
        rule.begin_round(state, 0)
        return rule

    return {"fedavg (streaming)": FedAvg, "ufm_softmax (streaming)": lambda: UfmSoftmax(beta=2.0),
            "median": CoordinateMedian, "trimmed_mean": lambda: TrimmedMean(beta=f / n),
            "krum": lambda: Krum(f=f, m=1), "multi_krum": lambda: Krum(f=f, m=None),
            "bulyan": lambda: Bulyan(f=bulyan_f), "norm_bounding": NormBounding,
            "centered_clipping": CenteredClipping, "fltrust": fltrust, "flame": flame, "resfl_robust": robust}


def _one_round(rule: AggregationRule, deltas: torch.Tensor, reports: list[ClientReport]) -> None:
    if isinstance(rule, GatherAllRule):
        rule.aggregate(deltas, reports)
    else:
        acc = StreamingWeightedSum(deltas.shape[1], device=deltas.device)
        for r, d in zip(reports, deltas):
            acc.add(rule.score(r), d)
    if deltas.is_cuda:
        torch.cuda.synchronize()


def time_rule(make: Callable[[], AggregationRule], deltas: torch.Tensor, repeats: int = 1) -> float:
    """Median wall-clock seconds of one round's aggregation (streaming: the per-client folds), after one untimed
    round: on CUDA a rule's first call loads its kernels and grows the allocator, which on an H200 made 10 clients
    look slower than 100 (docs/performance.md, "GPU readiness")."""
    reports = _reports(deltas.shape[0])
    _one_round(make(), deltas, reports)
    times = []
    for _ in range(repeats):
        rule = make()
        t0 = time.perf_counter()
        _one_round(rule, deltas, reports)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def measure(numel: int, counts: tuple[int, ...] = (10, 100), repeats: int = 1, device: str = "cpu",
            only: tuple[str, ...] | None = None) -> list[AggregationTime]:
    out = []
    for n in counts:
        deltas = torch.randn(n, numel, generator=torch.Generator().manual_seed(n)).to(device) * 1e-3
        for name, make in rules(n, numel).items():
            if only and name.split(" ")[0] not in only:
                continue
            memory = "O(|theta|)" if "streaming" in name else "N x |theta|"
            out.append(AggregationTime(name, n, time_rule(make, deltas, repeats), memory))
        del deltas
    return out


def table(results: list[AggregationTime], numel: int, device: str):
    from rich.table import Table

    counts = sorted({r.clients for r in results})
    t = Table(title=f"aggregation time per round, |theta| = {numel:,} floats, {device}, "
                    f"{torch.get_num_threads()} thread(s)")
    t.add_column("rule")
    t.add_column("memory")
    for n in counts:
        t.add_column(f"{n} clients (s)", justify="right")
    for name in dict.fromkeys(r.rule for r in results):
        row = {r.clients: r for r in results if r.rule == name}
        t.add_row(name, next(iter(row.values())).memory, *(f"{row[n].seconds:.3f}" if n in row else "-"
                                                           for n in counts))
    return t
