"""PUFFLE's tunable lambda (Corbucci et al. 2024; docs/method.md §5a): lambda steers the batches' parity gap towards
a target T. At the start of a client's round lambda = max(0, D_train - T) / (1 - T) (0 in its first round); after
each local step v <- m v + (T - (D~ + N(0, sigma_lambda^2))), lambda <- clip_[0,1](lambda - alpha v), with
alpha = alpha_0 decay^t in server round t. lambda, v and the round count are client-local state.

lambda and v stay 0-d tensors on the gap's device: an update costs no host read."""

from __future__ import annotations

from dataclasses import dataclass

import torch

LAMBDA_KEY, VELOCITY_KEY, ROUNDS_KEY = "parity.lambda", "parity.velocity", "parity.rounds"


def starting_lambda(d_train: float, target: float) -> float:
    """The round's first lambda from the received model's gap on the training split: 0 at or under the target,
    the excess rescaled from [0, 1 - T] to [0, 1] above it."""
    return max(0.0, d_train - target) / (1.0 - target)


@dataclass(frozen=True)
class LambdaSettings:
    target: float  # T
    momentum: float  # m
    alpha: float  # alpha_0, lambda's step size in round 0
    alpha_decay: float  # alpha's factor per server round


class TunableLambda:
    def __init__(self, settings: LambdaSettings):
        self.settings = settings
        self.reset()

    def reset(self) -> None:
        """A client that has not trained yet."""
        self.lam = torch.zeros((), dtype=torch.float64)
        self.velocity = torch.zeros((), dtype=torch.float64)
        self.rounds = 0
        self.alpha = self.settings.alpha
        self._noise: torch.Generator | None = None

    @property
    def first_round(self) -> bool:
        return self.rounds == 0

    def begin_round(self, d_train: float | None, round_idx: int, seed: int) -> None:
        """d_train: the received model's gap on the training split (None in the client's first round: lambda 0)."""
        s = self.settings
        self.lam = torch.tensor(0.0 if d_train is None else starting_lambda(d_train, s.target), dtype=torch.float64)
        self.alpha = s.alpha * s.alpha_decay ** round_idx
        self.rounds += 1
        self._noise = torch.Generator().manual_seed(seed)

    def weight(self, like: torch.Tensor) -> torch.Tensor:
        """The current lambda as a loss weight (the dtype and device of `like`)."""
        return self.lam.to(device=like.device, dtype=like.dtype)

    def step(self, gap: torch.Tensor, sigma: float | None) -> None:
        """One update from the step's batch gap D~, noised with sigma_lambda (None or 0: no noise)."""
        s = self.settings
        observed = gap.detach().to(torch.float64).reshape(())
        if sigma:
            observed = observed + sigma * torch.randn((), generator=self._noise, dtype=torch.float64).to(gap.device)
        self.velocity = s.momentum * self.velocity.to(observed.device) + (s.target - observed)
        self.lam = (self.lam.to(observed.device) - self.alpha * self.velocity).clamp(0.0, 1.0)

    def export_state(self) -> dict[str, torch.Tensor]:
        return {LAMBDA_KEY: self.lam.detach().cpu().clone(), VELOCITY_KEY: self.velocity.detach().cpu().clone(),
                ROUNDS_KEY: torch.tensor(self.rounds, dtype=torch.int64)}

    def import_state(self, state: dict[str, torch.Tensor] | None) -> None:
        """A client's own lambda, v and round count (None, or a state without them: a fresh client)."""
        self.reset()
        if state is not None and ROUNDS_KEY in state:
            self.lam = state[LAMBDA_KEY].to(torch.float64).clone()
            self.velocity = state[VELOCITY_KEY].to(torch.float64).clone()
            self.rounds = int(state[ROUNDS_KEY])
