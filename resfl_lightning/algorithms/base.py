"""What a federated method sets on the clients: the local loss terms, the adversary, SAM / best-epoch local
optimisation and the server's SWA schedule (docs/method.md). The server's aggregation rule is chosen separately
(conf/aggregation/).

conf/algorithm/<method>.yaml names the class in `_target_` and sets its keys; the keys below are the ones every
method has (RESFL, FedAvg, FairFed, CurvFed, FedSAM and FedSWA are all this class with other values). A method that
needs more subclasses it (dp.py, privfairfl.py):
    attach(client, run)         add what a freshly built client needs (called before any gradient exists)
    server_callbacks(evaluation)  callbacks the method adds to the run (inserted after the global evaluation)
    per_sample_clipping         True for DP-SGD methods (the config rules then exclude SAM, curvature, fp16)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from resfl_lightning.config import rules
from resfl_lightning.config.fields import Section, setting
from resfl_lightning.losses.grl import GRL_SCHEDULES
from resfl_lightning.losses.roi_mean import ROI_IMPLS


@dataclass(kw_only=True)
class Algorithm(Section):
    section = "algorithm"
    checks = (rules.swa_start_value, rules.swa_lr_pair)
    per_sample_clipping: ClassVar[bool] = False

    _target_: str = setting(doc="the method's class, 'module.Class'")
    name: str = setting(doc="the method's name in run names and logs")
    table_order: int | None = setting(None, "the method's row in `resfl table` (null: not a table method)", ge=0)
    ufm_cohorts: str = setting("groups", "what the method's UFM compares (conf/train.yaml: ufm.cohorts reads it)",
                               choices=("groups", "cluster", "slices", "proxy"))
    beta: float = setting(2.0, "UFM-softmax temperature (conf/aggregation/ufm_softmax.yaml reads it)", ge=0)
    lambda_priv: float = setting(0.1, "weight of the reversed adversary gradient into the encoder", ge=0)
    lambda_fair: float = setting(0.01, "weight of the evidential uncertainty regulariser", ge=0)
    lambda_curv: float = setting(0.0, "weight of the Fisher curvature term", ge=0)
    grl_scale: float = setting(1.0, "gradient-reversal scale", ge=0)
    lambda_task: float = setting(1.0, "weight of the task loss (CurvFed: 1 - a)", ge=0)
    w_fair: float = setting(0.0, "weight of the feature-mean gap L_fair (puffle_resfl, PFU-FL, PrivFairFL-Pre)", ge=0)
    lambda_parity: float = setting(0.0, "PUFFLE's lambda: (1 - lambda) L_task + lambda x the demographic-parity gap "
                                   "of the predictions (0: off; the paper tunes it in [0.05, 0.9], docs/method.md "
                                   "§5a)", ge=0, lt=1)
    local_reweighting: bool = setting(False, "classification: weight each client's task loss by Kamiran-Calders "
                                      "P(a)P(y)/P(a,y) from its training split (FairFed's optional local "
                                      "debiasing, docs/method.md §5a)")
    # phi's strength (conf/adversary/ presets; docs/method.md §2 gives each key's reason)
    adversary_hidden: int = setting(128, "hidden width of the adversary phi", ge=1)
    adversary_depth: int = setting(1, "hidden layers of phi (1: the paper's two-layer MLP; 0: a linear probe)", ge=0)
    adversary_lr: float = setting(1e-3, "the adversary's own learning rate", gt=0)
    adversary_optimizer: str = setting("adam", "the adversary's optimiser", choices=("adam", "sgd"))
    adversary_steps: int = setting(1, "adversary updates per encoder step", ge=1)
    adversary_warmup_rounds: int = setting(0, "first rounds in which phi trains but reverses no gradient into the "
                                           "encoder", ge=0)
    adversary_schedule: str = setting("constant", "GRL coefficient over training: constant, or dann's "
                                      "2/(1+exp(-gamma p)) - 1 of the progress p", choices=GRL_SCHEDULES)
    adversary_dann_gamma: float = setting(10.0, "gamma of the dann GRL schedule", gt=0)
    adversary_reinit: bool = setting(False, "a fresh phi every client-round instead of the client's kept one")
    adversary_roi_bins: int = setting(7, "detection: roi_align bins per side before phi's box mean (7: the exact "
                                      "pooling; 1 with roi_samples k: one bin of k x k samples, cheaper)", ge=1)
    adversary_roi_samples: int = setting(-1, "detection: roi_align samples per bin side (-1: adaptive, ceil(box / "
                                         "bins) per box)", ge=-1)
    adversary_roi_impl: str = setting("roi_align", "detection: the box mean through torchvision's roi_align "
                                      "(bitwise as before) or separable (the same value as two weight vectors and "
                                      "matrix products, ~10x cheaper with its backward)", choices=ROI_IMPLS)
    anneal_rounds: int = setting(10, "KL annealing min(1, t / anneal_rounds), t in rounds", ge=1)
    curv_iters: int = setting(3, "power iterations per step of the curvature term", ge=1)
    curv_params: str = setting("head", "parameters the curvature term sees", choices=("head", "all"))
    curv_eps: float = setting(0.005, "CurvFed aggregation's epsilon (conf/aggregation/curvfed.yaml reads it)", gt=0)
    report_fim: bool = setting(False, "clients report their top Fisher eigenvalue (CurvFed aggregation needs it)")
    fim_iters: int = setting(20, "power iterations of the reported Fisher eigenvalue", ge=1)
    sam_rho: float = setting(0.0, "SAM radius of the local optimiser (0: plain SGD)", ge=0)
    keep_best_epoch: bool = setting(False, "evaluate after each local epoch and send the best one")
    swa_start: int | float | None = setting(None, "server SWA from this round, or this fraction of the rounds")
    swa_every: int = setting(1, "SWA cycle length in rounds", ge=1)
    swa_lr_high: float | None = setting(None, "cyclical client lr during SWA, as a multiple of optim.lr", gt=0)
    swa_lr_low: float | None = setting(None, "low end of the SWA lr cycle, as a multiple of optim.lr", gt=0)
    swa_bn_update: bool = setting(True, "recompute the SWA model's BatchNorm statistics from one no-grad pass per "
                                  "aggregated client (averaged statistics belong to no model; docs/method.md §5a)")

    def loss_weights(self):
        from resfl_lightning.clients.base import LossWeights

        return LossWeights(lambda_priv=self.lambda_priv, lambda_fair=self.lambda_fair, lambda_curv=self.lambda_curv,
                           grl_scale=self.grl_scale, anneal_rounds=self.anneal_rounds, curv_iters=self.curv_iters,
                           curv_params=self.curv_params, lambda_task=self.lambda_task, w_fair=self.w_fair,
                           lambda_parity=self.lambda_parity)

    def adversary(self, rounds: int | None = None):
        """phi's settings; `rounds` (federation.rounds) is the horizon of the dann schedule's progress."""
        from resfl_lightning.clients.base import AdversarySettings

        return AdversarySettings(lr=self.adversary_lr, optimizer=self.adversary_optimizer,
                                 steps=self.adversary_steps, hidden=self.adversary_hidden, depth=self.adversary_depth,
                                 warmup_rounds=self.adversary_warmup_rounds, schedule=self.adversary_schedule,
                                 dann_gamma=self.adversary_dann_gamma, reinit=self.adversary_reinit,
                                 roi_bins=self.adversary_roi_bins, roi_samples=self.adversary_roi_samples,
                                 roi_impl=self.adversary_roi_impl,
                                 rounds=rounds)

    def swa_start_round(self, rounds: int) -> int | None:
        """swa_start as a 0-based round index: ceil(fraction x rounds) for a fraction in (0, 1) (FedSWA's
        s0 = ceil(0.75 R): the last quarter of the rounds; CurvFed's 0.2 x 80 = 16), or as is."""
        if isinstance(self.swa_start, float):
            return math.ceil(self.swa_start * rounds - 1e-9)  # 1e-9: a product just above an integer stays it
        return self.swa_start

    def attach(self, client: Any, run: Any) -> Any:
        """The client with what this method adds (nothing here); `run` is the validated run config."""
        return client

    def server_callbacks(self, evaluation: Any) -> list:
        """Callbacks this method adds to the run (none here); `evaluation` is the run's GlobalEvaluation."""
        return []
