"""What a federated method sets on the clients: the local loss terms, the adversary, SAM / best-epoch local
optimisation, the server's SWA schedule (docs/method.md) and its plug-ins at the client/server boundary
(clients/plugin.py). The server's aggregation rule is chosen separately (conf/aggregation/).

conf/algorithm/<method>.yaml names the class in `_target_` and sets its keys; the keys below are the ones every
method has (RESFL, FedAvg, FairFed, CurvFed, FedSAM and FedSWA are all this class with other values; the loss weights
and phi's settings are declared in clients/settings.py). A method that needs more subclasses it (dp.py, puffle.py,
privfairfl.py) and overrides:
    attach(client, run)           change a freshly built client (before any gradient exists), then add its plug-ins
    client_plugins(client, run)   the ClientPlugins a freshly built client gets, in hook order
    server_plugins()              the ServerPlugins the orchestrator calls at each round's end
    server_callbacks(evaluation)  callbacks the method adds to the run (inserted after the global evaluation)
    per_sample_clipping           True for DP-SGD methods (the config rules then exclude SAM, curvature, fp16)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from resfl_lightning.clients.settings import ADVERSARY_PREFIX, NOT_CONFIG_KEYS, AdversarySettings, LossWeights
from resfl_lightning.config import rules
from resfl_lightning.config.fields import Section, prefixed, setting


@dataclass(kw_only=True)
class Algorithm(LossWeights, prefixed(AdversarySettings, ADVERSARY_PREFIX, skip=NOT_CONFIG_KEYS), Section):
    section = "algorithm"
    checks = (rules.swa_start_value, rules.swa_lr_pair)
    per_sample_clipping: ClassVar[bool] = False

    _target_: str = setting(doc="the method's class, 'module.Class'")
    name: str = setting(doc="the method's name in run names and logs")
    table_order: int | None = setting(None, "the method's row in `resfl table` (null: not a table method)", ge=0)
    ufm_cohorts: str = setting("groups", "what the method's UFM compares (conf/train.yaml: ufm.cohorts reads it)",
                               choices=("groups", "cluster", "slices", "proxy"))
    beta: float = setting(2.0, "UFM-softmax temperature (conf/aggregation/ufm_softmax.yaml reads it)", ge=0)
    lambda_parity: float = setting(0.0, "PUFFLE's lambda: (1 - lambda) L_task + lambda x the demographic-parity gap "
                                   "of the predictions (0: off; the paper tunes it in [0.05, 0.9], docs/method.md "
                                   "§5a)", ge=0, lt=1)
    local_reweighting: bool = setting(False, "classification: weight each client's task loss by Kamiran-Calders "
                                      "P(a)P(y)/P(a,y) from its training split (FairFed's optional local "
                                      "debiasing, docs/method.md §5a)")
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

    def loss_weights(self) -> LossWeights:
        return LossWeights(**{f.name: getattr(self, f.name) for f in dataclasses.fields(LossWeights)})

    def adversary(self, rounds: int | None = None) -> AdversarySettings:
        """phi's settings; `rounds` (federation.rounds) is the horizon of the dann schedule's progress."""
        keys = [f.name for f in dataclasses.fields(AdversarySettings) if f.name not in NOT_CONFIG_KEYS]
        return AdversarySettings(**{k: getattr(self, ADVERSARY_PREFIX + k) for k in keys}, rounds=rounds)

    def swa_start_round(self, rounds: int) -> int | None:
        """swa_start as a 0-based round index: ceil(fraction x rounds) for a fraction in (0, 1) (FedSWA's
        s0 = ceil(0.75 R): the last quarter of the rounds; CurvFed's 0.2 x 80 = 16), or as is."""
        if isinstance(self.swa_start, float):
            return math.ceil(self.swa_start * rounds - 1e-9)  # 1e-9: a product just above an integer stays it
        return self.swa_start

    def attach(self, client: Any, run: Any) -> Any:
        """The client with this method's plug-ins, added before any gradient exists; `run` is the validated run
        config. A method that changes the client itself (DP-SGD's GroupNorm model) does so before calling this."""
        for plugin in self.client_plugins(client, run):
            client.add_plugin(plugin)
        return client

    def client_plugins(self, client: Any, run: Any) -> list:
        """The ClientPlugins (clients/plugin.py) a freshly built client gets, in hook order: here PUFFLE's parity
        term at a fixed lambda when lambda_parity > 0 (puffle.py adds its tunable lambda and fallback)."""
        if self.lambda_parity <= 0:
            return []
        from resfl_lightning.clients.parity_term import ParityTerm

        return [ParityTerm(self.lambda_parity)]

    def server_plugins(self) -> list:
        """The ServerPlugins (clients/plugin.py) the orchestrator calls at each round's end (none here)."""
        return []

    def server_callbacks(self, evaluation: Any) -> list:
        """Callbacks this method adds to the run (none here); `evaluation` is the run's GlobalEvaluation."""
        return []
