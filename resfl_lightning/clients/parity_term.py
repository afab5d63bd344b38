"""PUFFLE's parity term as a client plug-in (Corbucci et al. 2024; docs/method.md §5a): the local loss becomes
(1 - lambda) lambda_task L_task + ... + lambda x the demographic-parity gap of the predictions (losses/parity.py),
lambda fixed or tunable (parity_lambda.py), a group absent from a batch compared through the server's pooled P(k|z)
(parity_rates.py). Under DP-SGD the tunable lambda's updates and the shared counts are noised and accounted on the
client's ClientDP (privacy/dp.py) from the shares of algorithm.dp.epsilon_split.

A client PUFFLE runs on provides, for its own model outputs (clients/tabular.py, clients/detection.py):
    parity_gap(outputs, batch, rates)   the step's gap (rates: the server's P(k|z) or None)
    parity_mass(batch)                  (per-unit parity mass, unit groups) of one batch
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from resfl_lightning.clients.parity_lambda import TunableLambda
from resfl_lightning.clients.parity_rates import COUNTS_REPORT_KEY, PARITY_COUNTS_KEY, SENSITIVITY, GlobalParity
from resfl_lightning.clients.plugin import ClientPlugin, TermWeights
from resfl_lightning.losses.parity import parity_gap

LAMBDA_STREAM, COUNTS_STREAM = 5, 6  # FederatedClient.round_seed streams of the lambda noise and the counts' noise


@torch.no_grad()
def dataset_parity_mass(client: Any, loader) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(mass, groups) of the client's (received) model over every unit of a loader, in eval mode; None: no unit."""
    was_training = client.training
    client.eval()
    masses, groups = [], []
    for batch in loader:
        mass, g = client.parity_mass(client.place(batch))
        masses.append(mass.float())
        groups.append(g.reshape(-1))
    client.train(was_training)
    return (torch.cat(masses), torch.cat(groups)) if masses else None


def units_gap(units: tuple[torch.Tensor, torch.Tensor] | None) -> float:
    """The parity gap of (mass, groups) over a whole split; 0 without any unit."""
    return 0.0 if units is None else float(parity_gap(*units))


def dataset_parity_gap(client: Any, loader) -> float:
    """PUFFLE's D_train: the gap of the client's (received) model over every unit of a loader, in eval mode."""
    return units_gap(dataset_parity_mass(client, loader))


class ParityTerm(ClientPlugin):
    """lambda_parity: the fixed lambda; tunable: the tunable lambda (None: fixed); fallback: the missing-group
    fallback (None: off); dp: the client's ClientDP that pays for their noise (None: exact, unaccounted)."""

    def __init__(self, lambda_parity: float, tunable: TunableLambda | None = None,
                 fallback: GlobalParity | None = None, dp: Any = None):
        self.lambda_parity, self.tunable, self.fallback, self.dp = lambda_parity, tunable, fallback, dp
        self._step_gap: torch.Tensor | None = None  # the step's gap, for the tunable lambda's update

    @property
    def active(self) -> bool:
        """The step computes the gap: a fixed lambda > 0, or the tunable lambda (its update needs the gap)."""
        return self.lambda_parity > 0 or self.tunable is not None

    @property
    def global_rates(self) -> torch.Tensor | None:
        """The server's P(k|z) the gap falls back on for an absent group (None: no fallback yet or at all)."""
        return None if self.fallback is None else self.fallback.rates

    def receive(self, client: Any, sent: Mapping[str, torch.Tensor]) -> None:
        if self.fallback is not None:
            self.fallback.receive(sent.get(PARITY_COUNTS_KEY))

    def start_training(self, client: Any, loader_for_epoch) -> None:
        """From one pass of the received model over the training split: the shared counts (fallback on) and the
        tunable lambda's round-start value from D_train (0 in the client's first round) and its noise generator,
        drawn from (the client's first seed, round) alone."""
        tunable, fallback = self.tunable, self.fallback
        wants_gap = tunable is not None and not tunable.first_round
        units = dataset_parity_mass(client, loader_for_epoch(0)) if wants_gap or fallback is not None else None
        if fallback is not None:
            self._release_counts(client, units)
        if tunable is None:
            return
        tunable.begin_round(units_gap(units) if wants_gap else None, client.round_idx, client.round_seed(LAMBDA_STREAM))
        self._step_gap = None

    def _release_counts(self, client: Any, units: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """The round's counts over the training split, noised for epsilon_stat under DP (exact without DP); the
        noise is drawn from (the client's first seed, round) alone."""
        std = None if self.dp is None else self.dp.stat_sigma * SENSITIVITY
        self.fallback.release(*(units or (None, None)), std=std, seed=client.round_seed(COUNTS_STREAM))
        if self.dp is not None and units is not None:
            self.dp.account_stat()

    def loss_term(self, client: Any, outputs: Any, batch: dict) -> torch.Tensor | None:
        return client.parity_gap(outputs, batch, self.global_rates) if self.active else None

    def weigh_term(self, term: torch.Tensor, task: torch.Tensor) -> TermWeights:
        """(1 - lambda) on the task loss, lambda on the gap; the tunable lambda is this step's, and the gap updates
        it after the step."""
        lam = self.lambda_parity
        logged = {"parity": term.detach()}
        if self.tunable is not None:
            lam = self.tunable.weight(task)
            self._step_gap = term.detach()
            logged["lambda_parity"] = lam.detach()
        return TermWeights(1.0 - lam, lam, logged)

    def after_step(self, client: Any) -> None:
        """The tunable lambda's update from the step's gap, noised for epsilon_lambda under DP."""
        if self.tunable is None or self._step_gap is None:
            return
        sigma = self.dp.lambda_sigma if self.dp is not None else None
        self.tunable.step(self._step_gap, sigma)
        if sigma is not None:
            self.dp.account_lambda()
        self._step_gap = None

    def report(self, client: Any, val_loader) -> dict[str, Any]:
        """The (noisy) (k, z) counts released this round (none without the fallback)."""
        return {} if self.fallback is None else {COUNTS_REPORT_KEY: self.fallback.report()}

    def export_state(self) -> dict[str, torch.Tensor]:
        return {} if self.tunable is None else self.tunable.export_state()

    def import_state(self, state: Mapping[str, torch.Tensor] | None) -> None:
        if self.tunable is not None:
            self.tunable.import_state(state)
