"""RESFL whose weights a liar cannot buy (`algorithm=resfl_robust`; docs/method.md "Threat model of resfl_robust").

Each round, on the server's root split (federation/root.py):
1. u_i: `mode=server` evaluates theta_G + d_i on the root split and takes u_i = clip(UFM_i) (gated to clip_high when
   the root utility is under the UFM gate), ignoring the reported u; `mode=checked` keeps the reported u but drops a
   client whose report differs from the server's estimate by more than check_k bootstrap standard errors
   (sqrt(SE_server^2 + SE_client^2)); a gated report (u = clip_high, the lowest weight) is never dropped.
2. each update is clipped: `clip=norm` to the round's median norm, `centered` around the previous aggregate with
   tau = the median distance to it (one centered-clipping step per update), `none` leaves it.
3. FLTrust-style trust TS_i = ReLU(cos(clipped d_i, g_0)) with the server's root update g_0 (`trust: false`: 1).
4. y_i = softmax(-beta u)_i * TS_i (0 for a dropped client), normalised over the clients with y_i > 0 and projected
   onto the capped simplex {w : sum w = 1, 0 <= w <= c}, c = 1/(n - f) (robust_ops.project_capped_simplex); f is
   `f`, or floor(assumed_fraction * n) when the server does not know it. When only k < 1/c clients keep a positive
   weight, each gets c and the weights sum to k c < 1: the rest of the step stays at the current model, so any f
   clients hold at most f c = f/(n - f) whatever trust leaves (raising c to 1/k would hand them f/k).
5. aggregate = sum_i w_i clipped d_i, or the weighted coordinate-wise trimmed mean / median (`combiner`).
Gather-all: memory N x |theta| float32 (+ the clipped copy in float64); server cost per round: one local training on
the root split and N evaluations on it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch

from resfl_lightning.aggregation.base import GatherAllRule
from resfl_lightning.aggregation.robust_ops import (
    centered_clip,
    norm_bound,
    project_capped_simplex,
    trust_scores,
    weighted_median,
    weighted_trimmed_mean,
)
from resfl_lightning.metrics.ufm import relative_gate_threshold
from resfl_lightning.types import ClientReport

PREVIOUS_KEY = "resfl_robust/previous_aggregate"
MODES, CLIPS, COMBINERS = ("server", "checked"), ("none", "norm", "centered"), ("mean", "trimmed_mean", "median")
CHECK_SES = ("reported", "bounded")


@dataclass(frozen=True)
class UfmPolicy:
    """The clients' clip / gate settings (ufm.*), applied by the server to its own root-split estimates."""

    clip_low: float = 0.0
    clip_high: float = 5.0
    gate: float | None = 0.30
    gate_mode: str = "absolute"
    gate_mad_k: float = 3.0
    insufficient_u: float = 5.0

    def server_u(self, ufm_raw: list[float], utility: list[float]) -> list[float]:
        """clip(UFM) per update; clip_high for an update whose root utility is under the gate."""
        if self.gate_mode == "relative":
            gate = relative_gate_threshold(utility, self.gate_mad_k)
        else:
            gate = self.gate
        out = []
        for raw, util in zip(ufm_raw, utility):
            u = self.insufficient_u if not math.isfinite(raw) else min(max(raw, self.clip_low), self.clip_high)
            out.append(self.clip_high if gate is not None and util < gate else u)
        return out


def capped_weights(scores: np.ndarray, cap: float) -> np.ndarray:
    """Scores (>= 0) normalised over their positive entries and projected onto the capped simplex there; zero-score
    entries keep weight 0. With only k < 1/cap positive entries each gets the cap (sum k * cap < 1): no entry ever
    exceeds the cap, so any f entries hold at most f * cap."""
    scores = np.asarray(scores, dtype=np.float64)
    support = np.flatnonzero(scores > 0)
    if support.size == 0:
        raise ValueError("capped weights: no positive score")
    w = np.zeros_like(scores)
    if support.size * cap < 1 - 1e-12:
        w[support] = cap
        return w
    y = scores[support] / scores[support].sum()
    w[support] = project_capped_simplex(y, cap)
    return w


@dataclass
class RobustResfl(GatherAllRule):
    on_parameters = True  # compares whole updates: on their parameters (base.py)
    beta: float = 2.0
    mode: str = "server"  # server | checked
    check_k: float = 3.0
    # checked: the client's SE in the check as reported, or bounded by the server's own (a report's SE widens the
    # check, so an unbounded one lets a client pass any u with a huge SE)
    check_se: str = "reported"
    f: int | None = None  # Byzantine clients the server assumes; null: floor(assumed_fraction * n)
    assumed_fraction: float = 0.3
    clip: str = "norm"  # none | norm | centered
    trust: bool = True
    combiner: str = "mean"  # mean | trimmed_mean | median
    trim_beta: float = 0.1
    root_size: int = 100

    def __post_init__(self) -> None:
        for key, choices in (("mode", MODES), ("clip", CLIPS), ("combiner", COMBINERS), ("check_se", CHECK_SES)):
            if getattr(self, key) not in choices:
                raise ValueError(f"aggregation.{key} must be one of {list(choices)}, got {getattr(self, key)!r}")
        if self.beta < 0:
            raise ValueError(f"aggregation.beta must be >= 0, got {self.beta}")
        if not self.check_k > 0:
            raise ValueError(f"aggregation.check_k must be > 0, got {self.check_k}")
        if self.f is not None and self.f < 0:
            raise ValueError(f"aggregation.f must be >= 0 or null, got {self.f}")
        if not 0 <= self.assumed_fraction < 0.5:
            raise ValueError(f"aggregation.assumed_fraction must lie in [0, 0.5), got {self.assumed_fraction}")
        if not 0 <= self.trim_beta < 0.5:
            raise ValueError(f"aggregation.trim_beta must lie in [0, 0.5), got {self.trim_beta}")
        if self.root_size < 1:
            raise ValueError(f"aggregation.root_size must be >= 1, got {self.root_size}")
        self.root = None  # the ServerRoot of attach, or any object with update() and evaluate(delta) in tests
        self.policy = UfmPolicy()
        self._center: torch.Tensor | None = None
        self._last: torch.Tensor | None = None
        self._weights: dict[int, float] = {}
        self.details: dict[str, list[float]] = {}  # the last round's server u, trust and drops (for inspection)

    def attach(self, federation, model, layout) -> None:
        u = model.ufm
        if self.mode == "checked" and getattr(u, "bootstrap_resamples", 1) == 0:
            raise ValueError("aggregation.mode=checked compares reports in bootstrap standard errors: set "
                             "ufm.bootstrap_resamples > 0")
        self.policy = UfmPolicy(u.clip_low, u.clip_high, u.gate, u.gate_mode, u.gate_mad_k, u.insufficient_u)
        super().attach(federation, model, layout)
        self.root = federation.server_root(model, layout, self.root_size)

    def begin_round(self, state, round_idx: int) -> None:
        self._center = state.extra.get(PREVIOUS_KEY)
        if self.root is not None:
            self.root.begin_round(state, round_idx)

    def end_round(self, state):
        if self._last is None or self.clip != "centered":
            return state
        return replace(state, extra={**state.extra, PREVIOUS_KEY: self._last.detach().clone()})

    @property
    def uses_client_evaluation(self) -> bool:  # type: ignore[override]
        """mode=checked reads the reported u, SE and gate; mode=server estimates u itself on the root split."""
        return self.mode == "checked"

    def assumed_f(self, n: int) -> int:
        return self.f if self.f is not None else math.floor(self.assumed_fraction * n)

    def cap(self, n: int) -> float:
        """1/(n - f): the smallest cap that still allows uniform weight on the n - f honest clients."""
        return 1.0 / max(1, n - self.assumed_f(n))

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        n = deltas.shape[0]
        x = deltas.to(torch.float64)
        # the server evaluates whole models (buffers included); clipping and trust compare parameters
        evals = [self.root.evaluate(d) for d in (deltas if self.full_updates is None else self.full_updates)]
        server_u = self.policy.server_u([e.ufm_raw for e in evals], [e.utility for e in evals])
        keep = np.ones(n, dtype=bool)
        if self.mode == "server":
            u = server_u
        else:
            u = [r.u for r in reports]
            for i, (r, e, su) in enumerate(zip(reports, evals, server_u)):
                own = r.ufm_se if self.check_se == "reported" else min(_finite(r.ufm_se), _finite(e.ufm_se))
                se = math.sqrt(_sq(e.ufm_se) + _sq(own))
                keep[i] = r.gated or abs(r.u - su) <= self.check_k * se
        x = self._clipped(x)
        trust = (trust_scores(x, self.parameter_part(self.root.update(), x.shape[1]).to(x.device)) if self.trust
                 else torch.ones(n, dtype=torch.float64)).cpu().numpy()
        soft = torch.softmax(torch.tensor([-self.beta * v for v in u], dtype=torch.float64), dim=0).numpy()
        scores = soft * trust * keep
        self.details = {"server_u": server_u, "trust": trust.tolist(), "kept": keep.astype(float).tolist()}
        if not (scores > 0).any():
            warnings.warn("resfl_robust: no update kept a positive weight (every one dropped or distrusted); the "
                          "round adds nothing", RuntimeWarning, stacklevel=2)
            self._weights = {r.client_id: 0.0 for r in reports}
            self._last = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
            return self._last
        w = capped_weights(scores, self.cap(n))
        self._weights = {r.client_id: float(wi) for r, wi in zip(reports, w)}
        total = float(w.sum())
        short = total < 1 - 1e-9  # too few trusted updates: the combiner runs on w / total, scaled back by total
        wt = torch.as_tensor(w / total if short else w, dtype=torch.float64, device=x.device)
        if self.combiner == "mean":
            out = (wt[:, None] * x).sum(dim=0)
        elif self.combiner == "trimmed_mean":
            out = weighted_trimmed_mean(x, wt, self.trim_beta)
        else:
            out = weighted_median(x, wt)
        if short:
            out = out * total
        self._last = out
        return out

    def _clipped(self, x: torch.Tensor) -> torch.Tensor:
        if self.clip == "norm":
            return norm_bound(x)[0]
        if self.clip == "centered":
            center = (self.parameter_part(self._center, x.shape[1]) if self._center is not None
                      else torch.zeros(x.shape[1], dtype=torch.float64)).to(x.device, torch.float64)
            _, tau = centered_clip(x, center)  # tau = median distance to the centre
            diff = x - center
            norms = diff.norm(dim=1)
            factor = torch.where(norms > tau, tau / norms.clamp_min(1e-300), torch.ones_like(norms))
            return center + diff * factor[:, None]
        return x

    def weights(self, reports: list[ClientReport]) -> dict[int, float]:
        return {r.client_id: self._weights.get(r.client_id, 0.0) for r in reports}


def _sq(v: float) -> float:
    return v * v if math.isfinite(v) else 0.0


def _finite(v: float) -> float:
    return v if math.isfinite(v) else 0.0
