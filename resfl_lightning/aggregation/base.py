"""The two kinds of aggregation rule (docs/design.md, "Aggregation rules").

- StreamingRule: a client's weight is softmax_i(score(report_i)) with a score that depends on its own report alone,
  so each rank folds omega_i * delta_i into one running float64 sum as clients finish and the ranks combine with one
  all-reduce: memory O(|theta|) whatever the number of clients.
- GatherAllRule: the rule needs every update of the round at once (median, trimmed mean, Krum, ...). The orchestrator
  gathers the round's deltas from every rank, stacks them in client-id order and calls `aggregate`; memory
  O(N |theta|), checked against `federation.gather_memory_mb` before the first round.

A new rule is one module here (a subclass of either kind) + one yaml in conf/aggregation/ naming it in `_target_`.
"""

from __future__ import annotations

import warnings
from typing import ClassVar

import torch

from resfl_lightning.types import ClientReport


class GatherMemoryError(MemoryError):
    """A gather-all rule's stacked updates would not fit the configured memory budget."""


class AggregationRule:
    """What every rule shares: a name for logs, and the per-client weights the round logs."""

    gathers_all: ClassVar[bool] = False
    needs_group_stats: ClassVar[bool] = False  # True: `prepare` gets every client's group counts before training
    needs_fim: ClassVar[bool] = False  # True: clients must report their Fisher eigenvalue (algorithm.report_fim)
    # False only for a rule whose weights read no evaluation field of a report (ufm_raw, ufm_ema, u, gated,
    # val_utility*, eval_loss, ufm_se, val_delta_eop): federation.client_validation=when_used then lets the clients
    # skip their validation pass in non-final rounds. True is the safe default for a new rule.
    uses_client_evaluation: ClassVar[bool] = True

    @property
    def name(self) -> str:
        return type(self).__name__

    def weights(self, reports: list[ClientReport]) -> dict[int, float]:
        raise NotImplementedError

    def preview(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        """The round's aggregate (float64) of the stack deltas[N, P] (rows following `reports`), as the orchestrator
        would apply it, leaving the rule as it was (logged weights, state carried to the next round): what an attack
        tailored to the rule evaluates (attacks/byzantine_calibrated.py). Call it after begin_round."""
        raise NotImplementedError

    # --- hooks for rules that need more than the round's updates (all no-ops by default) -----------------------
    def attach(self, federation, model, layout) -> None:
        """Once before the first round: a rule that computes on the server side (FLTrust's root update) keeps what
        it needs here (the live client module, the flat layout, the federated data; `federation.server_root(model,
        layout, size)` carves the server's root split, federation/root.py)."""

    def begin_round(self, state, round_idx: int) -> None:
        """Before the round's aggregation: the current global model (`state.theta`) and the rule's own state kept
        in `state.extra` (so that a resumed run continues exactly)."""

    def end_round(self, state):
        """After an applied (not skipped) round: the ServerState with the rule's own state written into `extra`."""
        return state

    def round_metrics(self) -> dict[str, float]:
        """Diagnostics of the round's aggregation the orchestrator logs with the round's metrics (none by default)."""
        return {}

    def check_clients(self, num_clients: int) -> None:
        """Raise ValueError when the rule cannot aggregate this many updates (checked before the first round for the
        sampled count; a round left with fewer usable updates is skipped)."""

    def check_memory(self, num_clients: int, numel: int, budget_mb: float) -> None:
        """Stop before the first round when num_clients stacked float32 updates exceed the budget (a gather-all rule,
        or any rule in a round that an omniscient attack forces to gather)."""
        need_mb = num_clients * numel * 4 / 2**20
        if need_mb > budget_mb:
            raise GatherMemoryError(
                f"aggregation {self.name} gathers every update: {num_clients} clients x {numel:,} values need "
                f"{need_mb:,.0f} MiB, more than federation.gather_memory_mb={budget_mb:g}; sample fewer clients "
                "per round (federation.clients_per_round) or choose a streaming rule")


class StreamingRule(AggregationRule):
    """Maps a ClientReport to an unnormalised log-weight; omega = softmax over the round's clients."""

    def score(self, report: ClientReport) -> float:
        raise NotImplementedError

    def weights(self, reports: list[ClientReport]) -> dict[int, float]:
        scores = torch.tensor([self.score(r) for r in reports], dtype=torch.float64)
        w = torch.softmax(scores, dim=0).tolist()
        return {r.client_id: wi for r, wi in zip(reports, w)}

    def preview(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        """sum_i omega_i delta_i, summed as the orchestrator sums a gathered round of a streaming rule."""
        weights = self.weights(reports)
        total = torch.zeros(deltas.shape[1], dtype=torch.float64, device=deltas.device)
        for r, row in zip(reports, deltas):
            total.add_(row.to(torch.float64), alpha=weights[r.client_id])
        return total


class GatherAllRule(AggregationRule):
    """Sees the round's updates stacked as deltas[N, P] (rows in the order of `reports`, i.e. by client id).

    A rule that compares whole updates (norms, distances, cosines, clusters) sets `on_parameters`: it is given their
    trainable-parameter coordinates only, because the float buffers (BatchNorm running statistics) are no gradient,
    no attack touches them, and they can carry most of an update's norm (99 % on the Adult MLP), which would make
    every such comparison one of the buffers. The buffers are then averaged with the client weights the rule logs
    (`weights`: such a rule must log the weights it applied; docs/method.md §4: float buffers are aggregated with the
    parameters' weights).
    Other rules (coordinate-wise median and trimmed mean, a user's own) see every coordinate."""

    gathers_all = True
    on_parameters: ClassVar[bool] = False
    param_mask: torch.Tensor | None = None  # True on trainable parameters (attach); None: every coordinate alike
    full_updates: torch.Tensor | None = None  # during aggregate_round: the round's whole updates (for evaluation)

    def attach(self, federation, model, layout) -> None:
        self.param_mask = layout.parameter_mask(model)

    def aggregate(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        """The aggregate update (P values); theta_G <- theta_G + server_lr * aggregate."""
        raise NotImplementedError

    def aggregate_round(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        """The round's aggregate of whole updates (what the orchestrator calls): `aggregate` on every coordinate,
        or for an `on_parameters` rule on the parameter coordinates, with the buffers averaged by the weights it
        logged (no buffer change when they are all 0, as when the rule adds nothing)."""
        mask = self.param_mask
        if not self.on_parameters or mask is None or bool(mask.all()):
            return self.aggregate(deltas, reports).to(torch.float64)
        mask = mask.to(deltas.device)
        self.full_updates = deltas
        try:
            params = self.aggregate(deltas[:, mask], reports).to(torch.float64)
        finally:
            self.full_updates = None
        logged = self.weights(reports)
        w = torch.tensor([logged[r.client_id] for r in reports], dtype=torch.float64, device=deltas.device)
        out = torch.zeros(deltas.shape[1], dtype=torch.float64, device=deltas.device)
        out[mask] = params
        if float(w.sum()) > 0:
            out[~mask] = (w[:, None] * deltas[:, ~mask].to(torch.float64)).sum(dim=0) / w.sum()
        return out

    def preview(self, deltas: torch.Tensor, reports: list[ClientReport]) -> torch.Tensor:
        """aggregate_round run on `deltas`, then the rule's attributes restored: a rule keeps its round state in
        attributes it rebinds (logged weights, the aggregate it carries), so every rule, a user's own included,
        previews exactly what it would aggregate. Its warnings are left to the round's real aggregate."""
        saved = dict(vars(self))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return self.aggregate_round(deltas, reports)
        finally:
            vars(self).clear()
            vars(self).update(saved)

    def parameter_part(self, vector: torch.Tensor, width: int) -> torch.Tensor:
        """A server-side whole-model vector (root update, global model, a stored aggregate) cut to the `width`
        coordinates `aggregate` was given: its parameter coordinates inside aggregate_round, itself otherwise."""
        if vector.numel() == width or self.param_mask is None:
            return vector
        return vector[self.param_mask.to(vector.device)]

    def weights(self, reports: list[ClientReport]) -> dict[int, float]:
        """Logged per-client weight: the effective weights the last `aggregate` of these clients recorded
        (`record_effective`), else one equal vote each (a rule that weighs clients otherwise overrides this)."""
        effective = getattr(self, "_effective", None)
        if effective is not None and set(effective) == {r.client_id for r in reports}:
            return {r.client_id: effective[r.client_id] for r in reports}
        return {r.client_id: 1.0 / len(reports) for r in reports}

    def record_effective(self, reports: list[ClientReport], picked: torch.Tensor) -> None:
        """Record each client's effective weight: the mean over coordinates of the coefficient its value has in the
        aggregate, for a rule whose aggregate is, per coordinate, the mean of the same number of picked values
        (`picked`: row indices, [k, P], or [m] for whole updates; a coordinate-wise median of an even count picks
        two). The logged weights then sum to 1 and say how much of the aggregate came from each client (Krum's
        selected client gets 1, a median's attacker the share of coordinates where its value was taken)."""
        counts = torch.bincount(picked.reshape(-1).to(torch.int64), minlength=len(reports)).to(torch.float64)
        counts = counts / counts.sum()
        self._effective = {r.client_id: float(c) for r, c in zip(reports, counts)}
