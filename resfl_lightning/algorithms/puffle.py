"""PUFFLE (Corbucci et al., ECAI 2024; docs/method.md §5a): DP-SGD on (1 - lambda) L_task + lambda x the parity
gap, with lambda fixed (`algorithm.lambda_parity`) or tunable (clients/parity_lambda.py: steered towards a target
gap, its noisy updates paid from epsilon_lambda of `algorithm.dp.epsilon_split`). An absent group's term falls back
on the server's global P(k|z) (clients/parity_rates.py) under DP exactly when the split gives epsilon_stat a share
(the shared counts' budget), without DP when `algorithm.parity_global_fallback` is true (exact counts). The client's
part is the plug-in of clients/parity_term.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resfl_lightning.algorithms.dp import DPSGD
from resfl_lightning.config import rules
from resfl_lightning.config.fields import setting


@dataclass(kw_only=True)
class Puffle(DPSGD):
    checks = (*DPSGD.checks, rules.tunable_lambda_budget, rules.parity_fallback_budget)

    lambda_mode: str = setting("fixed", "fixed: lambda = lambda_parity; tunable: steered towards parity_target "
                               "(docs/method.md §5a)", choices=("fixed", "tunable"))
    parity_target: float = setting(0.1, "tunable: the target gap T", gt=0, lt=1)
    parity_momentum: float = setting(0.5, "tunable: momentum m of lambda's velocity", ge=0, lt=1)
    parity_alpha: float = setting(1.0, "tunable: lambda's step size alpha in round 0", gt=0)
    parity_alpha_decay: float = setting(0.95, "tunable: alpha's factor per server round", gt=0, le=1)
    parity_global_fallback: bool = setting(False, "without DP: an absent group uses the server's P(k|z) from exact "
                                           "client counts (under DP: on exactly when epsilon_split gives stat a "
                                           "share)")

    @property
    def global_fallback(self) -> bool:
        """The missing-group fallback is on: under DP when the shared counts have a budget, else when asked."""
        if self.dp.enabled:
            split = self.dp.epsilon_split
            return split is not None and split[1] > 0
        return self.parity_global_fallback

    def client_plugins(self, client: Any, run: Any) -> list:
        """DP-SGD's plug-in, then the parity term with the tunable lambda and the missing-group fallback (their noise
        paid on DP-SGD's accountant) in place of the base class's fixed-lambda term."""
        from resfl_lightning.clients.parity_lambda import LambdaSettings, TunableLambda
        from resfl_lightning.clients.parity_rates import GlobalParity
        from resfl_lightning.clients.parity_term import ParityTerm

        dp = self.dp_plugins(client, run)
        fallback = GlobalParity(client.num_groups) if self.global_fallback else None
        tunable = None
        if self.lambda_mode == "tunable":
            tunable = TunableLambda(LambdaSettings(target=self.parity_target, momentum=self.parity_momentum,
                                                   alpha=self.parity_alpha, alpha_decay=self.parity_alpha_decay))
        return [*dp, ParityTerm(self.lambda_parity, tunable, fallback, dp=dp[0] if dp else None)]

    def server_plugins(self) -> list:
        """The server sums the clients' counts for the fallback."""
        from resfl_lightning.clients.parity_rates import PooledCounts

        return [PooledCounts()] if self.global_fallback else []
