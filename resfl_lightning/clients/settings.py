"""The loss weights and phi's settings a client trains with. Each key is declared here once, with its default, doc
and range: the Algorithm schema (resfl_lightning/algorithms/base.py) inherits LossWeights' fields as algorithm.<key>
and AdversarySettings' as algorithm.adversary_<key>."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resfl_lightning.config.fields import setting
from resfl_lightning.losses.curvature import CURV_DIRECTIONS
from resfl_lightning.losses.grl import GRL_SCHEDULES
from resfl_lightning.losses.roi_mean import ROI_IMPLS

ADVERSARY_PREFIX = "adversary_"  # AdversarySettings.<key> is the config key algorithm.adversary_<key>
NOT_CONFIG_KEYS = ("rounds",)  # AdversarySettings fields set from elsewhere (federation.rounds)


@dataclass(kw_only=True)
class LossWeights:
    """L_local = lambda_task L_task + lambda_priv L_adv + lambda_fair L_unc + lambda_curv L_curv + w_fair L_fair
    (docs/method.md); a method's plug-ins may add their own term (clients/plugin.py)."""

    lambda_priv: float = setting(0.1, "weight of the reversed adversary gradient into the encoder", ge=0)
    lambda_fair: float = setting(0.01, "weight of the evidential uncertainty regulariser", ge=0)
    lambda_curv: float = setting(0.0, "weight of the Fisher curvature term", ge=0)
    grl_scale: float = setting(1.0, "gradient-reversal scale", ge=0)
    lambda_task: float = setting(1.0, "weight of the task loss (CurvFed: 1 - a)", ge=0)
    w_fair: float = setting(0.0, "weight of the feature-mean gap L_fair (puffle_resfl, PFU-FL, PrivFairFL-Pre)", ge=0)
    anneal_rounds: int = setting(10, "KL annealing min(1, t / anneal_rounds), t in rounds", ge=1)
    curv_iters: int = setting(3, "power iterations per step of the curvature term", ge=1)
    curv_refresh: int = setting(1, "the curvature term on one step in k on average (drawn with probability 1/k, "
                                "weighted k: the same loss in expectation); 1 = every step", ge=1)
    curv_direction: str = setting("converged", "the vector the curvature term is taken along: converged (curv_iters "
                                  "power iterations a step) or held (the last step's, moved one power step: one J v "
                                  "a step)", choices=CURV_DIRECTIONS)
    curv_params: str = setting("head", "parameters the curvature term sees", choices=("head", "all"))


@dataclass(kw_only=True)
class AdversarySettings:
    """phi's strength (docs/method.md §2): its own optimiser (RESFL Algorithm 1, line 8; lambda_priv scales only the
    reversed gradient into theta), capacity, warm-up, GRL schedule and whether it is kept across rounds (conf/adversary/
    presets). The defaults are the paper-minimal reading."""

    hidden: int = setting(128, "hidden width of the adversary phi", ge=1)
    depth: int = setting(1, "hidden layers of phi (1: the paper's two-layer MLP; 0: a linear probe)", ge=0)
    lr: float = setting(1e-3, "the adversary's own learning rate", gt=0)
    optimizer: str = setting("adam", "the adversary's optimiser", choices=("adam", "sgd"))
    steps: int = setting(1, "adversary updates per encoder step (extra ones reuse the step's detached features)",
                         ge=1)
    warmup_rounds: int = setting(0, "first rounds in which phi trains but reverses no gradient into the encoder", ge=0)
    schedule: str = setting("constant", "GRL coefficient over training: constant, or dann's 2/(1+exp(-gamma p)) - 1 "
                            "of the progress p", choices=GRL_SCHEDULES)
    dann_gamma: float = setting(10.0, "gamma of the dann GRL schedule", gt=0)
    reinit: bool = setting(False, "a fresh phi every client-round instead of the client's kept one")
    roi_bins: int = setting(7, "detection: roi_align bins per side before phi's box mean (7: the exact pooling; 1 "
                            "with roi_samples k: one bin of k x k samples, cheaper)", ge=1)
    roi_samples: int = setting(-1, "detection: roi_align samples per bin side (-1: adaptive, ceil(box / bins) per "
                               "box)", ge=-1)
    roi_impl: str = setting("separable", "detection: the box mean as two weight vectors and matrix products "
                            "(separable, ~10x cheaper with its backward) or through torchvision's roi_align (the "
                            "same value to float rounding; the default before 2026-11-29)", choices=ROI_IMPLS)
    rounds: int | None = None  # the run's horizon T: the dann schedule's progress is counted over it

    def __post_init__(self) -> None:
        if self.schedule not in GRL_SCHEDULES:
            raise ValueError(f"adversary schedule must be one of {GRL_SCHEDULES}, got {self.schedule!r}")
        if self.roi_bins < 1 or self.roi_samples == 0 or self.roi_samples < -1:
            raise ValueError(f"adversary ROI pooling: bins >= 1 and samples -1 or >= 1, got {self.roi_bins}, "
                             f"{self.roi_samples}")
        if self.roi_impl not in ROI_IMPLS:
            raise ValueError(f"adversary ROI pooling: impl must be one of {ROI_IMPLS}, got {self.roi_impl!r}")
        if self.schedule == "dann" and (self.rounds is None or self.rounds < 1):
            raise ValueError(f"the dann GRL schedule needs the run's number of rounds (>= 1), got {self.rounds}")

    def build(self, params) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        return torch.optim.SGD(params, lr=self.lr, momentum=0.9)
