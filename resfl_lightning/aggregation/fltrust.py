"""FLTrust (Cao, Fang, Liu & Gong, NDSS 2021; docs/method.md §10): the server trains its own root update g_0
on a small clean root split (federation/root.py) and trusts each update by TS_i = ReLU(cos(d_i, g_0)):

    aggregate = sum_i TS_i (||g_0|| / ||d_i||) d_i / sum_i TS_i       (no update when sum_i TS_i = 0)

No bound on f. Gather-all here (memory N x |theta| float32); it could stream once g_0 is known before the clients
finish. Extra server cost per round: one local training on the root split: one pass of it per local epoch
(`root_steps: root_split`, as before issue 57: one step on 100 rows, against 26 per Adult client at the conf
defaults), or as many batches per local epoch as the median client (`matched`: the paper's server runs the clients'
local iterations). Each round logs aggregation/fltrust_root_norm_ratio = ||g_0|| / median_i ||d_i||, the factor the
median-norm update is rescaled by."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.aggregation.robust_ops import median, trust_scores
from resfl_lightning.types import ClientReport


def fltrust_aggregate(deltas: torch.Tensor, root_update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(aggregate, trust scores TS); the aggregate is 0 when every score is 0."""
    x, g = deltas.to(torch.float64), root_update.to(torch.float64)
    ts = trust_scores(x, g)
    if float(ts.sum()) == 0.0:
        return torch.zeros(x.shape[1], dtype=torch.float64, device=x.device), ts
    norms = x.norm(dim=1).clamp_min(1e-300)
    scaled = x * (g.norm() / norms)[:, None]  # every update rescaled to the root update's norm
    return (ts[:, None] * scaled).sum(dim=0) / ts.sum(), ts


def median_client_batches(data) -> int:
    """The training batches per local epoch of the median client (the lower middle one of an even count)."""
    counts = sorted(len(data.train_loader(c, seed=0)) for c in range(data.num_clients))
    return counts[(len(counts) - 1) // 2]


@dataclass
class FLTrust(GatherAllRule):
    uses_client_evaluation = False  # the updates and the server's own root update
    on_parameters = True  # compares whole updates: on their parameters (base.py)
    root_size: int = 100  # items carved from the attack reserve for the server's root split
    root_steps: str = "root_split"  # root_split: one pass per local epoch | matched: a median client's batches

    def __post_init__(self) -> None:
        self.root = None  # the ServerRoot of attach (tests may set any object with update())
        self._weights: dict[int, float] = {}
        self._ratio: float | None = None
        if self.root_size < 1:
            raise ValueError(f"aggregation.root_size must be >= 1, got {self.root_size}")
        if self.root_steps not in ("root_split", "matched"):
            raise ValueError(f"aggregation.root_steps must be root_split or matched, got {self.root_steps!r}")

    def attach(self, federation, model, layout) -> None:
        super().attach(federation, model, layout)
        self.root = federation.server_root(model, layout, self.root_size)
        if self.root_steps == "matched":
            if any(p.per_example_loss for p in getattr(model, "plugins", ())):  # DP-SGD draws its own batches
                raise ValueError("aggregation.root_steps=matched cannot set the root update's steps under DP-SGD "
                                 "(Poisson batches); use root_steps=root_split")
            self.root.batches_per_epoch = median_client_batches(self.root.data)

    def begin_round(self, state, round_idx: int) -> None:
        self.root.begin_round(state, round_idx)
        self._ratio = None

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        root = self.parameter_part(self.root.update(), deltas.shape[1])
        out, ts = fltrust_aggregate(deltas, root.to(deltas.device))
        spread = median(deltas.to(torch.float64).norm(dim=1))
        self._ratio = float(root.to(torch.float64).norm()) / spread if spread > 0 else None
        total = float(ts.sum())
        if total == 0.0:
            warnings.warn("FLTrust: no update has a positive cosine to the root update; the round adds nothing",
                          RuntimeWarning, stacklevel=2)
        self._weights = {r.client_id: (float(t) / total if total else 0.0) for r, t in zip(reports, ts)}
        return out

    def weights(self, reports: list[ClientReport]) -> dict[int, float]:
        return {r.client_id: self._weights.get(r.client_id, 0.0) for r in reports}

    def round_metrics(self) -> dict[str, float]:
        return {} if self._ratio is None else {"aggregation/fltrust_root_norm_ratio": self._ratio}
