"""Update-aware attribute inference (attack.update_aia) and its callback; the protocol is update_aia.py.

Each rank summarises the updates of the clients it trains, labelled with the client's dominant training group
(evaluation ground truth only). Rank 0, the server, trains its shadow clients from each round's global model.
Every round the real rows are gathered to rank 0, which keeps them with the shadow rows in the checkpoint
(ServerState.extra), so a resumed run attacks the same rows as an uninterrupted one. At the last round (and every
`attack.every` rounds) rank 0 fits the probe on the shadow rows and scores it on the real ones. With IID shards (one
dominant group among the real clients) no shadow client is trained and the attack reports itself not applicable.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from resfl_lightning.attacks.base import Attack, AttackRun, attack_due, write_attack_file
from resfl_lightning.attacks.outputs import default_head_prefixes
from resfl_lightning.attacks.settings import UpdateAiaSettings
from resfl_lightning.attacks.update_aia import (
    ShadowClients,
    applicable,
    plan_shadow_clients,
    real_client_labels,
    update_attribute_inference,
)
from resfl_lightning.attacks.update_features import update_features
from resfl_lightning.config import ConfigError
from resfl_lightning.data.federated import base_data

REAL_KEY, SHADOW_KEY = "update_aia.real", "update_aia.shadow"  # ServerState.extra prefixes


def rows_to_state(rows: list[tuple[int, int, np.ndarray, int]], key: str) -> dict[str, torch.Tensor]:
    """(round, client, features, label) rows as two tensors for ServerState.extra (a checkpoint holds tensors only)."""
    meta = torch.tensor([[r[0], r[1], r[3]] for r in rows], dtype=torch.int64).reshape(-1, 3)
    x = torch.from_numpy(np.stack([r[2] for r in rows])) if rows else torch.zeros((0, 0), dtype=torch.float32)
    return {f"{key}.meta": meta, f"{key}.x": x}


def rows_from_state(extra: dict[str, torch.Tensor], key: str) -> list[tuple[int, int, np.ndarray, int]]:
    """The rows `rows_to_state` stored ([] when the checkpoint has none: a fresh run, or one before this attack)."""
    if f"{key}.meta" not in extra:
        return []
    meta, x = extra[f"{key}.meta"].tolist(), extra[f"{key}.x"].numpy()
    return [(int(r), int(c), x[i].copy(), int(lab)) for i, (r, c, lab) in enumerate(meta)]


class UpdateAttributeInference(Attack):
    Settings = UpdateAiaSettings
    order = 40

    def __init__(self, settings: UpdateAiaSettings, seed: int, every: int | None = None):
        self.settings, self.seed, self.every = settings, int(seed), every
        self.rows: list[tuple[int, int, np.ndarray, int]] = []  # this round's real updates on this rank
        self.real_rows: list[tuple[int, int, np.ndarray, int]] = []  # rank 0: every round's, from every rank
        self.shadow_rows: list[tuple[int, int, np.ndarray, int]] = []  # (round, shadow client, features, label)
        self.labels: dict[int, int] = {}
        self.applicable = False
        self.shadow: ShadowClients | None = None
        self.segments: list[tuple[str, int]] = []
        self.prefixes: list[str] = []
        self.theta, self.int_buffers = None, None  # the global model the current round's clients start from

    @classmethod
    def build(cls, settings: UpdateAiaSettings, run: AttackRun) -> UpdateAttributeInference:
        return cls(settings, seed=run.seed, every=run.every)

    def on_fit_start(self, federation, model, layout, state) -> None:
        s = self.settings
        self.segments = layout.segments()
        self.prefixes = list(s.head_prefixes) if s.head_prefixes else default_head_prefixes(model)
        if not any(name.startswith(tuple(self.prefixes)) for name, _ in self.segments):
            raise ConfigError(f"attack.update_aia.head_prefixes: no layer starts with {self.prefixes} "
                              f"(first layers: {[n for n, _ in self.segments[:5]]})")
        self.labels = real_client_labels(federation.data)
        self.applicable = applicable(self.labels)
        self.rows, self.real_rows, self.shadow_rows = [], [], []
        if federation.fabric.is_global_zero:  # a resumed run: the rows of the rounds its checkpoint holds
            self.real_rows = rows_from_state(state.extra, REAL_KEY)
            self.shadow_rows = rows_from_state(state.extra, SHADOW_KEY)
        if self.applicable and federation.fabric.is_global_zero:
            self.shadow = plan_shadow_clients(federation, s, self.seed, self.segments, self.prefixes)
            self.theta, self.int_buffers = state.theta.clone(), dict(state.int_buffers)

    def on_client_end(self, federation, round_idx: int, report, delta) -> None:
        feats = update_features(delta, self.segments, head_prefixes=self.prefixes, top_k=self.settings.top_k)
        self.rows.append((round_idx, report.client_id, feats.astype(np.float32), self.labels[report.client_id]))

    def _gathered(self, federation) -> list[tuple[int, int, np.ndarray, int]]:
        if federation.fabric.world_size == 1:
            return list(self.rows)
        parts: list = [None] * federation.fabric.world_size
        dist.all_gather_object(parts, self.rows)
        return [row for part in parts for row in part]

    def on_round_end(self, federation, round_idx: int, layout, state, metrics: dict) -> None:
        if self.shadow is not None:  # rank 0: this round's shadow updates, from the model the clients started from
            x = self.shadow.round_updates(layout, self.theta, self.int_buffers, round_idx)
            self.shadow_rows += [(round_idx, -(k + 1), x[k], label) for k, label in enumerate(self.shadow.labels)]
            self.theta, self.int_buffers = state.theta.clone(), dict(state.int_buffers)
        gathered = self._gathered(federation)  # every rank joins the collective, every round
        self.rows = []
        if not federation.fabric.is_global_zero:
            return
        self.real_rows += gathered
        # kept in the state the orchestrator checkpoints after this hook (mutated in place: hooks return nothing)
        state.extra.update(rows_to_state(self.real_rows, REAL_KEY))
        state.extra.update(rows_to_state(self.shadow_rows, SHADOW_KEY))
        if not attack_due(round_idx, federation.settings.rounds, self.every):
            return
        rows = sorted(self.real_rows, key=lambda r: (r[0], r[1]))
        dim = 3 * len(self.segments) + 3
        real_x = np.stack([r[2] for r in rows]) if rows else np.zeros((0, dim), np.float32)
        shadow_x = np.stack([r[2] for r in self.shadow_rows]) if self.shadow_rows else np.zeros((0, dim), np.float32)
        result = update_attribute_inference(shadow_x, np.array([r[3] for r in self.shadow_rows], np.int64), real_x,
                                            np.array([r[3] for r in rows], np.int64),
                                            base_data(federation.data).num_groups, self.seed,
                                            self.settings, self.applicable)
        metrics.update(result["metrics"])
        write_attack_file(federation, f"update_aia_round_{round_idx:04d}", {
            "metrics": result["metrics"], "round": round_idx, "head_prefixes": self.prefixes,
            "top_k": self.settings.top_k, "real_client_labels": self.labels,
            "test_samples": [{"round": r[0], "client": r[1], "label": r[3]} for r in rows],
            "train_samples": [{"round": r[0], "shadow_client": r[1], "label": r[3]} for r in self.shadow_rows],
            "probe": result["probe"]})
