"""Server aggregation strategies (SPEC §4) and the streaming weighted sum that keeps memory O(|theta|).

Every strategy here is *linear*: omega_i = softmax_i(s_i) with a score s_i that depends on client i's report
alone. A rank can then fold each client's delta into one running sum as soon as it is trained (online softmax,
the same rescaling trick as streaming log-sum-exp) and the ranks combine with one all-reduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from resfl_lightning.types import ClientReport


class Aggregator:
    """Maps a ClientReport to an unnormalised log-weight; omega = softmax over the round's clients."""

    name = "base"

    def score(self, report: ClientReport) -> float:
        raise NotImplementedError

    def weights(self, reports: list[ClientReport]) -> dict[int, float]:
        scores = torch.tensor([self.score(r) for r in reports], dtype=torch.float64)
        w = torch.softmax(scores, dim=0).tolist()
        return {r.client_id: wi for r, wi in zip(reports, w)}


class FedAvg(Aggregator):
    """omega_i = n_i / sum_j n_j."""

    name = "fedavg"

    def score(self, report: ClientReport) -> float:
        if report.num_samples <= 0:
            raise ValueError(f"client {report.client_id} reported num_samples={report.num_samples}")
        return math.log(report.num_samples)


class Uniform(Aggregator):
    name = "uniform"

    def score(self, report: ClientReport) -> float:
        return 0.0


@dataclass
class UfmSoftmax(Aggregator):
    """RESFL: omega_i = exp(-beta u_i) / sum_j exp(-beta u_j); beta -> 0 recovers uniform averaging."""

    beta: float = 2.0
    name = "resfl"

    def __post_init__(self) -> None:
        if self.beta < 0:
            raise ValueError(f"algorithm.beta must be >= 0, got {self.beta}")

    def score(self, report: ClientReport) -> float:
        return -self.beta * report.u


@dataclass
class SharpnessAware(Aggregator):
    """CurvFed: omega = softmax(1 / (l_i * lambda_i + eps)): lower loss and flatter clients weigh more."""

    eps: float = 0.005
    name = "curvfed"

    def score(self, report: ClientReport) -> float:
        if math.isnan(report.fim_eigenvalue):
            raise ValueError(f"client {report.client_id} reported no FIM eigenvalue; curvfed aggregation needs "
                             "algorithm.report_fim=true")
        return 1.0 / (report.eval_loss * max(report.fim_eigenvalue, 0.0) + self.eps)


def build_aggregator(name: str, beta: float = 2.0, eps: float = 0.005, fairfed_beta: float = 1.0) -> Aggregator:
    table = {"fedavg": FedAvg, "uniform": Uniform}
    if name in table:
        return table[name]()
    if name in ("resfl", "ufm_softmax"):
        return UfmSoftmax(beta=beta)
    if name == "curvfed":
        return SharpnessAware(eps=eps)
    if name == "fairfed":
        from resfl_lightning.federation.fairfed import FairFed

        return FairFed(beta=fairfed_beta)
    raise ValueError(f"algorithm.aggregation={name!r} is not one of fedavg, uniform, resfl, curvfed, fairfed")


class StreamingWeightedSum:
    """sum_i softmax(s)_i * delta_i folded one client at a time, in float64, with online max-rescaling."""

    def __init__(self, numel: int, device: torch.device | str = "cpu"):
        self.acc = torch.zeros(numel, dtype=torch.float64, device=device)
        self.max_score = -math.inf
        self.normaliser = 0.0  # sum_i exp(s_i - max_score)

    def add(self, score: float, delta: torch.Tensor) -> None:
        if not torch.isfinite(delta).all():
            raise FloatingPointError("non-finite values in a client update")
        if score == -math.inf:  # weight exactly 0 (e.g. FairFed drove it to zero)
            return
        if score > self.max_score:
            shrink = math.exp(self.max_score - score) if math.isfinite(self.max_score) else 0.0
            self.acc.mul_(shrink)
            self.normaliser *= shrink
            self.max_score = score
        w = math.exp(score - self.max_score)
        self.acc.add_(delta.to(torch.float64), alpha=w)
        self.normaliser += w

    def rescale_for_global(self, global_max: float, global_normaliser: float) -> torch.Tensor:
        """This rank's share of the global weighted mean; summing the shares over ranks gives the mean."""
        if self.normaliser == 0.0:
            return self.acc
        return self.acc * (math.exp(self.max_score - global_max) / global_normaliser)


def combine_normalisers(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """(max_score, normaliser) per rank -> the global max and the global normaliser at that max."""
    live = [(m, z) for m, z in pairs if z > 0]
    if not live:
        raise ValueError("no client contributed an update this round")
    gmax = max(m for m, _ in live)
    return gmax, sum(z * math.exp(m - gmax) for m, z in live)
