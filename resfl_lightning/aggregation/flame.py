"""FLAME-style filtering (Nguyen et al., USENIX Security 2022; docs/method.md §10, a re-implementation checked there).

1. HDBSCAN (scikit-learn) on the pairwise cosine distances 1 - cos(W_i, W_j) of the clients' models W_i = G + d_i
   (`cluster_on: updates` uses the updates d_i instead), min_cluster_size = floor(n/2) + 1, min_samples = 1,
   allow_single_cluster; the largest cluster is admitted, the rest (noise and smaller clusters) dropped.
2. S = median over all n of ||W_i - G|| = ||d_i||; each admitted update is clipped to norm S; they are averaged.
3. Optional Gaussian noise N(0, (lambda S)^2) per coordinate, drawn from (run seed, round), so every rank adds the
   same noise: `noise_lambda` gives lambda as the paper does (0.001 for image tasks; issue 57's fidelity option),
   `epsilon` derives it as (1/epsilon) sqrt(2 ln(1.25/delta)) (the paper's epsilon, delta are not verified).
Needs f < n/2. Gather-all: memory N x |theta| float32 plus one n x n float64 Gram matrix."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.cluster import HDBSCAN

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.aggregation.robust_ops import median, norm_bound
from resfl_lightning.types import ClientReport

_NOISE_STREAM = 0x464C414D


def cosine_distances(x: torch.Tensor) -> np.ndarray:
    """1 - cos between the rows (float64, n x n, zero diagonal, clipped to [0, 2])."""
    x = x.to(torch.float64)
    norms = x.norm(dim=1).clamp_min(1e-300)
    cos = (x @ x.T) / (norms[:, None] * norms[None, :])
    dist = (1.0 - cos).clamp(0.0, 2.0).cpu().numpy()
    np.fill_diagonal(dist, 0.0)
    return dist


def flame_admitted(vectors: torch.Tensor) -> list[int]:
    """Rows in the largest HDBSCAN cluster of the cosine distances (empty when every row is noise)."""
    n = vectors.shape[0]
    labels = HDBSCAN(metric="precomputed", min_cluster_size=n // 2 + 1, min_samples=1,
                     allow_single_cluster=True, copy=True).fit(cosine_distances(vectors)).labels_
    clusters = labels[labels >= 0]
    if clusters.size == 0:
        return []
    largest = np.bincount(clusters).argmax()
    return [int(i) for i in np.flatnonzero(labels == largest)]


def flame_noise_scale(epsilon: float, delta: float) -> float:
    """lambda = (1/epsilon) sqrt(2 ln(1.25/delta))."""
    return math.sqrt(2 * math.log(1.25 / delta)) / epsilon


@dataclass
class Flame(GatherAllRule):
    uses_client_evaluation = False  # the updates only
    on_parameters = True  # compares whole updates: on their parameters (base.py)
    cluster_on: str = "models"  # models (W_i = G + d_i, the paper) | updates (d_i)
    epsilon: float | None = None  # noise off when null
    delta: float = 1e-3
    noise_lambda: float = 0.0  # lambda of the noise std lambda * S; 0: off (the default, as before issue 57)

    def __post_init__(self) -> None:
        if self.cluster_on not in ("models", "updates"):
            raise ValueError(f"aggregation.cluster_on must be models or updates, got {self.cluster_on!r}")
        if self.epsilon is not None and not self.epsilon > 0:
            raise ValueError(f"aggregation.epsilon must be > 0 or null, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"aggregation.delta must lie in (0, 1), got {self.delta}")
        if not (math.isfinite(self.noise_lambda) and self.noise_lambda >= 0):
            raise ValueError(f"aggregation.noise_lambda must be a finite number >= 0, got {self.noise_lambda}")
        if self.noise_lambda > 0 and self.epsilon is not None:
            raise ValueError("aggregation.noise_lambda and aggregation.epsilon both set the noise scale: give one "
                             f"(noise_lambda={self.noise_lambda}, epsilon={self.epsilon})")
        self.theta: torch.Tensor | None = None  # the global model G of the round
        self.seed, self.round_idx = 0, 0
        self._weights: dict[int, float] = {}

    def attach(self, federation, model, layout) -> None:
        super().attach(federation, model, layout)
        self.seed = int(federation.settings.seed)

    def begin_round(self, state, round_idx: int) -> None:
        self.theta, self.round_idx = state.theta, round_idx

    def check_clients(self, num_clients: int) -> None:
        if num_clients < 2:
            raise ValueError(f"aggregation Flame clusters the round's updates: needs at least 2, got {num_clients}")

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        self.check_clients(deltas.shape[0])
        x = deltas.to(torch.float64)
        if self.cluster_on == "models":
            if self.theta is None:
                raise RuntimeError("Flame clusters models G + d_i: begin_round must give the global model first")
            vectors = self.parameter_part(self.theta, x.shape[1]).to(x.device, torch.float64)[None, :] + x
        else:
            vectors = x
        admitted = flame_admitted(vectors)
        self._weights = {r.client_id: (1.0 / len(admitted) if i in admitted else 0.0) for i, r in enumerate(reports)}
        if not admitted:
            warnings.warn("Flame: HDBSCAN labelled every update noise; the round adds nothing", RuntimeWarning,
                          stacklevel=2)
            return torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
        median_norm = median(x.norm(dim=1))
        clipped, _ = norm_bound(x[admitted], median_norm)
        out = clipped.mean(dim=0)
        scale = self.noise_lambda if self.epsilon is None else flame_noise_scale(self.epsilon, self.delta)
        if scale > 0:
            gen = torch.Generator().manual_seed(int(np.random.SeedSequence(
                [self.seed, self.round_idx, _NOISE_STREAM]).generate_state(1)[0]))
            out = out + scale * median_norm * torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.device)
        return out

    def weights(self, reports: list[ClientReport]) -> dict[int, float]:
        return {r.client_id: self._weights.get(r.client_id, 0.0) for r in reports}
