"""The Byzantine attack family inside a run (docs/method.md §10): settings, the update transform and
the label-flip data.

Kinds (`attack.byzantine.kind`):
- per client, on the attacker's own update: sign_flip (-gamma d, the original attack), scaling (gamma d, a boost);
- omniscient, on the gathered round (every attacker sends one vector computed from the honest updates,
  attacks/byzantine_vectors.py): gaussian, alie, ipm, min_max, min_sum; and calibrated to the configured rule
  (attacks/byzantine_calibrated.py, the strength searched on the rule's `preview` of the round): optimal_alie,
  optimal_ipm, tailored_min_max, tailored_min_sum; and adaptive to resfl_robust (attacks/byzantine_adaptive.py,
  the root update estimated from the attackers' own updates): adaptive_cap, adaptive_trust, adaptive_drift;
- adaptive_report: the sign flip, with a report inside resfl_robust's `mode=checked` check (`report` hook);
- on the attacker's data: label_flip (y <- C - 1 - y on its training rows; tabular data only).
The optional l2 bound rescales what an attacker sends; BatchNorm running statistics are left alone unless
include_buffers. Omniscient kinds and the `mimic` report need the round's honest updates / reports: the transform
says so by `needs_round`, and the orchestrator then gathers every round's updates (memory N x |theta| float32 on
every rank) and calls `round_transform` before aggregating (federation/orchestrator.py). `on_client_end` callbacks
see an omniscient attacker's own trained update, not the vector it sends.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from resfl_lightning.attacks import byzantine_adaptive as adaptive
from resfl_lightning.attacks import byzantine_calibrated as calibrated
from resfl_lightning.attacks import byzantine_vectors as vectors
from resfl_lightning.attacks.byzantine import RELATIVE_STRENGTHS, SCHEDULES, is_strength, l2_bound, scheduled_attackers
from resfl_lightning.attacks.robustness import AttackDataWrapper, ByzantineUpdate
from resfl_lightning.attacks.settings import ByzantineSettings
from resfl_lightning.config import ConfigError
from resfl_lightning.types import ClientReport

PER_CLIENT_KINDS = ("sign_flip", "scaling")
CALIBRATED_KINDS = ("optimal_alie", "optimal_ipm", *calibrated.TAILORED)
ADAPTIVE_ROUND_KINDS = ("adaptive_cap", "adaptive_trust", "adaptive_drift")
OMNISCIENT_KINDS = ("gaussian", "alie", "ipm", "min_max", "min_sum", *CALIBRATED_KINDS, *ADAPTIVE_ROUND_KINDS)
REPORT_KINDS = ("adaptive_report",)
# what an adaptive kind reads of the rule (resfl_robust): the cap and softmax, or the check and the server's u formula
RULE_NEEDS = {"adaptive_cap": ("cap", "beta"), "adaptive_report": ("check_k", "policy")}
_GAMMA_KINDS = ("min_max", "min_sum", *calibrated.TAILORED)


def needs_spread(settings: ByzantineSettings) -> bool:
    """Kinds whose vector uses the honest updates' standard deviation (undefined for one honest update)."""
    return settings.kind in ("alie", "optimal_alie") or (settings.kind in _GAMMA_KINDS
                                                         and settings.perturbation == "std")


DATA_KINDS = ("label_flip",)
KINDS = PER_CLIENT_KINDS + OMNISCIENT_KINDS + REPORT_KINDS + DATA_KINDS
_GAUSSIAN_STREAM = 0x474155


@dataclass
class ByzantineAttackSettings(ByzantineSettings):
    """attack.byzantine: ByzantineSettings (fraction, gamma, l2_bound, include_buffers, report) + the keys below."""

    kind: str = "sign_flip"
    schedule: str = "fixed"  # fixed: the same attackers every round | per_round: redrawn from (seed, round)
    std: float | None = None  # gaussian: the noise std; null = median honest norm / sqrt(|theta|)
    alie_z: str = "paper"  # paper: Phi^-1((n - s)/n) | honest: Phi^-1((h - s)/h)
    ipm_epsilon: float | int | str = 0.1  # a number, or relative to the attack's n and f: n_over_f | h_over_2f
    perturbation: str = "unit"  # min_max / min_sum (and tailored_) direction: unit | sign | std
    gamma_init: float = 10.0  # min_max / min_sum: the search's first gamma (gamma <= 2 gamma_init)
    search_evals: int = 16  # calibrated kinds: evaluations of the rule in the line search; adaptive_cap: bisections
    trust_margin: float = 0.1  # adaptive_trust / _drift: cosine with the root-update estimate; adaptive_cap: slack
    report_margin: float = 0.5  # adaptive_report: eps in u_hat - (check_k - eps) SE

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = (("kind", KINDS), ("schedule", SCHEDULES), ("alie_z", vectors.ALIE_Z_FORMS),
                  ("perturbation", vectors.PERTURBATIONS))
        for key, choices in checks:
            if getattr(self, key) not in choices:
                raise ConfigError(f"attack.byzantine.{key}: must be one of {list(choices)}, got {getattr(self, key)!r}")
        if self.kind in OMNISCIENT_KINDS and self.report == "sent":
            raise ConfigError(f"attack.byzantine.report=sent: an omniscient attacker ({self.kind}) only knows what it "
                              "sends once the round is gathered, after the reports; use honest, lie or mimic")
        if self.std is not None and not (self.std >= 0 and math.isfinite(self.std)):
            raise ConfigError(f"attack.byzantine.std: must be null or a finite number >= 0, got {self.std}")
        if not is_strength(self.ipm_epsilon):
            raise ConfigError(f"attack.byzantine.ipm_epsilon: must be > 0 or one of {list(RELATIVE_STRENGTHS)}, got "
                              f"{self.ipm_epsilon!r}")
        if self.search_evals < 1:
            raise ConfigError(f"attack.byzantine.search_evals: must be >= 1, got {self.search_evals}")
        if not self.gamma_init > 0:
            raise ConfigError(f"attack.byzantine.gamma_init: must be > 0, got {self.gamma_init}")
        if not 0 < self.trust_margin <= 1:
            raise ConfigError(f"attack.byzantine.trust_margin: must lie in (0, 1], got {self.trust_margin}")
        if not (self.report_margin > 0 and math.isfinite(self.report_margin)):
            raise ConfigError(f"attack.byzantine.report_margin: must be a finite number > 0, got {self.report_margin}")
        if self.kind in REPORT_KINDS and self.report != "honest":
            raise ConfigError(f"attack.byzantine.report={self.report}: kind={self.kind} writes the attackers' report "
                              "itself; leave report=honest")


class ByzantineRound(ByzantineUpdate):
    """ByzantineUpdate (per-client sign flip, report modes) with schedules, the other kinds and the round hook.

    `rule` is the run's aggregation rule, whose `preview` the calibrated kinds search on and whose parameters the
    adaptive kinds read (never its root split or root update); `calibrated` holds the round index and the last
    calibrated search's result, `adaptive` the round index and the cosine an adaptive kind aimed at (for the round's
    metrics)."""

    settings: ByzantineAttackSettings

    def __init__(self, num_clients: int, settings: ByzantineAttackSettings, seed: int, mask: torch.Tensor | None = None,
                 clip_low: float = 0.0, rule=None):
        super().__init__(num_clients, settings, seed, mask, clip_low)
        self.epsilon = self.resolve("ipm_epsilon", settings.ipm_epsilon)
        self.rule = rule
        self.calibrated: tuple[int, calibrated.Calibrated] | None = None
        self.adaptive: tuple[int, float] | None = None
        self._drift: torch.Tensor | None = None
        if rule is not None:
            self._rule_for(settings.kind)

    def _rule_for(self, kind: str):
        """The rule, checked to have what `kind` reads of it (RULE_NEEDS)."""
        needs = RULE_NEEDS.get(kind, ())
        if self.rule is None:
            raise RuntimeError(f"attack.byzantine.kind={kind} reads the aggregation rule: ByzantineRound needs `rule` "
                               "(ByzantineAttack passes the federation's aggregator)")
        missing = [a for a in needs if not hasattr(self.rule, a)]
        if missing:
            raise ConfigError(f"attack.byzantine.kind={kind} attacks resfl_robust's {', '.join(needs)}: the run's "
                              f"aggregation {type(self.rule).__name__} has no {missing[0]} "
                              "(use algorithm=resfl_robust)")
        if kind == "adaptive_report" and not self.settings.report_margin < self.rule.check_k:
            raise ConfigError(f"attack.byzantine.report_margin={self.settings.report_margin}: must be below the "
                              f"rule's aggregation.check_k={self.rule.check_k} (the report sits inside the check)")
        return self.rule

    @property
    def needs_round(self) -> bool:
        return self.settings.kind in OMNISCIENT_KINDS or self.settings.report == "mimic"

    def attackers(self, round_idx: int) -> list[int]:
        s = self.settings
        return scheduled_attackers(s.schedule, self.num_clients, s.fraction, self.seed, round_idx)

    def __call__(self, client_id: int, round_idx: int, delta: torch.Tensor) -> torch.Tensor:
        kind = self.settings.kind
        if kind in ("sign_flip", "adaptive_report"):
            return super().__call__(client_id, round_idx, delta)
        if kind != "scaling" or client_id not in self.attackers(round_idx):
            return delta  # omniscient kinds act in round_transform, label_flip on the data
        return self._send(delta, lambda own: own * self.gamma)

    def report(self, client_id: int, round_idx: int, honest, validate_sent, report_u):
        """adaptive_report's attackers: the evaluation of what they send (as `sent`), u = the server's u formula on
        it minus (check_k - report_margin) SE, never gated (attacks/byzantine_adaptive.py); else the report mode's."""
        if self.settings.kind not in REPORT_KINDS or client_id not in self.attackers(round_idx):
            return super().report(client_id, round_idx, honest, validate_sent, report_u)
        rule = self._rule_for(self.settings.kind)
        result = validate_sent()
        ema, _, _ = report_u(result.ufm_raw, result.utility)  # the client's EMA state moves on as for `sent`
        u_hat = rule.policy.server_u([result.ufm_raw], [result.utility])[0]
        u = adaptive.within_se_report(u_hat, result.ufm_se, rule.check_k, self.settings.report_margin, self.clip_low)
        return result, (ema, u, False)

    def _send(self, own: torch.Tensor, make) -> torch.Tensor:
        """own with its attacked entries (parameters, or all with include_buffers) replaced by make(those entries),
        rescaled to the l2 bound when one is set."""
        mask = None if self.mask is None else self.mask.to(own.device)
        if mask is not None and mask.numel() != own.numel():
            raise ValueError(f"Byzantine mask has {mask.numel()} entries, the update {own.numel()}")
        part = own if mask is None else own[mask]
        sent = make(part).to(own.dtype)
        if self.settings.l2_bound is not None:
            sent = l2_bound(sent, self.settings.l2_bound)
        if mask is None:
            return sent
        out = own.clone()
        out[mask] = sent
        return out

    def round_transform(self, round_idx: int, reports: list[ClientReport],
                        deltas: torch.Tensor) -> tuple[list[ClientReport], torch.Tensor]:
        """The gathered round (rows of `deltas` follow `reports`): attackers' rows replaced by the omniscient vector,
        attackers' u replaced by the honest median under `mimic`."""
        attackers = set(self.attackers(round_idx))
        rows = [i for i, r in enumerate(reports) if r.client_id in attackers]
        honest = [i for i, r in enumerate(reports) if r.client_id not in attackers]
        if not rows:
            return reports, deltas
        if not honest:
            warnings.warn(f"round {round_idx}: every client is a Byzantine attacker; an omniscient attack observes no "
                          "honest update, so the attackers send their own updates and report as themselves",
                          RuntimeWarning, stacklevel=2)
            return reports, deltas
        if needs_spread(self.settings) and len(honest) < 2:
            warnings.warn(f"round {round_idx}: {self.settings.kind} needs the spread of at least 2 honest updates, "
                          f"the round has {len(honest)}; the attackers send their own updates this round",
                          RuntimeWarning, stacklevel=2)
            return reports, deltas
        if self.settings.report == "mimic":
            u = statistics.median(reports[i].u for i in honest)
            reports = [dataclasses.replace(r, u=float(u), gated=False) if i in rows else r
                       for i, r in enumerate(reports)]
        if self.settings.kind in OMNISCIENT_KINDS:
            deltas = deltas.clone()
            # computed on the coordinates it replaces: the buffers it leaves alone would otherwise carry most of the
            # norms and distances the Gaussian scale and the min-max / min-sum search read
            seen = deltas[honest] if self.mask is None else deltas[honest][:, self.mask.to(deltas.device)]
            if self.settings.kind in ADAPTIVE_ROUND_KINDS:
                own = deltas[rows] if self.mask is None else deltas[rows][:, self.mask.to(deltas.device)]
                if not float(own.to(torch.float64).mean(dim=0).norm()) > 0:
                    warnings.warn(f"round {round_idx}: the attackers' own updates average to zero, so "
                                  f"{self.settings.kind} has no estimate of the root update; they send their own "
                                  "updates this round", RuntimeWarning, stacklevel=2)
                    return reports, deltas
                found = self._adaptive(own, seen, [reports[i].u for i in honest + rows])
                self.adaptive, sent = (round_idx, found.cosine), found.sent
            elif self.settings.kind in CALIBRATED_KINDS:
                found = self._calibrated(seen, len(reports), len(rows), self._rule_aggregate(reports, deltas, rows))
                self.calibrated, sent = (round_idx, found), found.sent
            else:
                sent = self._omniscient(round_idx, seen, n=len(reports), f=len(rows))
            for i in rows:
                deltas[i] = self._send(deltas[i], lambda own, sent=sent: sent)
        return reports, deltas

    def _omniscient(self, round_idx: int, honest: torch.Tensor, n: int, f: int) -> torch.Tensor:
        s = self.settings
        if s.kind == "alie":
            return vectors.alie(honest, f, s.alie_z)
        if s.kind == "ipm":
            return vectors.ipm(honest, self.epsilon)
        if s.kind == "min_max":
            return vectors.min_max(honest, s.perturbation, s.gamma_init)
        if s.kind == "min_sum":
            return vectors.min_sum(honest, s.perturbation, s.gamma_init)
        gen = torch.Generator().manual_seed(int(np.random.SeedSequence(
            [self.seed, round_idx, _GAUSSIAN_STREAM]).generate_state(1)[0]))
        return vectors.gaussian(honest, s.std, gen)

    def _adaptive(self, own: torch.Tensor, honest: torch.Tensor, u: list[float]) -> adaptive.Adaptive:
        """The adaptive kind's vector from the attackers' own and the honest updates; `u` = the round's reported u,
        honest rows first (adaptive_cap's estimate of the softmax; attacks/byzantine_adaptive.py)."""
        s = self.settings
        if s.kind == "adaptive_trust":
            return adaptive.trust_aware(own, honest, s.trust_margin)
        if s.kind == "adaptive_drift":
            if self._drift is None or self._drift.numel() != honest.shape[1]:
                self._drift = adaptive.drift_direction(honest.shape[1], self.seed)
            return adaptive.drift(own, honest, self._drift.to(honest.device), s.trust_margin)
        rule = self._rule_for(s.kind)
        h = honest.shape[0]
        if not rule.uses_client_evaluation:
            # the server rates what it receives on its root split: the attackers expect a typical honest value
            u = u[:h] + [float(np.median(u[:h]))] * (len(u) - h)
        return adaptive.cap_aware(own, honest, np.asarray(u, dtype=np.float64), rule.beta, rule.cap(len(u)),
                                  s.trust_margin, s.search_evals)

    def _calibrated(self, honest: torch.Tensor, n: int, f: int, aggregate) -> calibrated.Calibrated:
        s = self.settings
        if s.kind == "optimal_alie":
            try:
                start = vectors.alie_z(n, f, s.alie_z)
            except ValueError:  # no fixed z at this n, f (attackers hold a majority): search from 0, as byzfl does
                start = 0.0
            return calibrated.optimal_alie(honest, aggregate, start, s.search_evals)
        if s.kind == "optimal_ipm":
            return calibrated.optimal_ipm(honest, aggregate, self.epsilon, s.search_evals)
        return calibrated.tailored(s.kind, honest, aggregate, s.perturbation, s.gamma_init, s.search_evals)

    def _rule_aggregate(self, reports: list[ClientReport], deltas: torch.Tensor, rows: list[int]):
        """aggregate(sent): the rule's preview of the round with every attacker's row sent as `round_transform`
        sends it (l2 bound included), read on the attacked coordinates."""
        rule = self._rule_for(self.settings.kind)
        stack = deltas.clone()  # one working copy; only the attackers' rows change between evaluations
        mask = None if self.mask is None else self.mask.to(deltas.device)

        def aggregate(sent: torch.Tensor) -> torch.Tensor:
            for i in rows:
                stack[i] = self._send(deltas[i], lambda own: sent)
            out = rule.preview(stack, reports)
            return out if mask is None else out[mask]

        return aggregate


class LabelFlippedData(AttackDataWrapper):
    """Federated data whose attackers of the round train on flipped labels y <- C - 1 - y (tabular data)."""

    def __init__(self, base: Any, transform: ByzantineRound):
        if not (dataclasses.is_dataclass(base) and hasattr(base, "y")):
            raise ConfigError(f"attack.byzantine.kind=label_flip needs class labels of a tabular dataset, not "
                              f"{type(base).__name__}; for detection use attack=poisoning (drop or relabel the "
                              "target group's boxes)")
        self.base, self.transform, self.round_idx = base, transform, 0
        self.flipped = dataclasses.replace(base, y=(base.num_classes - 1) - base.y)

    def train_loader(self, client_id: int, seed: int):
        if client_id in self.transform.attackers(self.round_idx):
            return self.flipped.train_loader(client_id, seed)
        return self.base.train_loader(client_id, seed)
