"""PUFFLE's three-part privacy budget (Corbucci et al. 2024; docs/method.md §5a): epsilon = epsilon_SGD +
epsilon_stat + epsilon_lambda. Each part is spent by its own mechanism and accounted on its own (DP-SGD and the
lambda updates by opacus' accountant, the shared counts by the Gaussian mechanism's exact curve, privacy/gaussian.py);
by basic composition the parts' epsilons and deltas add up, so each part gets delta / 3 and the run's total stays
(target_epsilon, target_delta)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PARTS = ("sgd", "stat", "lambda")  # DP-SGD, the shared group statistics, the noisy gap of the lambda updates


@dataclass(frozen=True)
class BudgetPart:
    epsilon: float | None  # None: a fixed noise multiplier, no epsilon target
    delta: float


def budget_parts(target_epsilon: float | None, target_delta: float,
                 split: Sequence[float] | None) -> dict[str, BudgetPart]:
    """The run's (epsilon, delta) per part. No split: all of it to DP-SGD (FedAvg-DP's budget, unchanged)."""
    if split is None:
        return {"sgd": BudgetPart(target_epsilon, target_delta)}
    if target_epsilon is None or len(split) != len(PARTS):
        raise ValueError(f"an epsilon split needs a target epsilon and {len(PARTS)} shares {PARTS}, got "
                         f"{target_epsilon} and {list(split)}")
    return {name: BudgetPart(target_epsilon * float(share), target_delta / len(PARTS))
            for name, share in zip(PARTS, split)}
