"""Update-aware attribute inference (SPEC §7): from every client update the server receives, predict the client's
dominant group.

Each rank summarises the updates of the clients it trains (attacks/update_features.py: per-layer l2 norm, sign
ratio, top-k magnitude histogram, head statistics) and labels them with the client's dominant group in its clean
training split (evaluation ground truth only: the server never receives it). At the last round (and every
`attack.every` rounds) the rows are gathered to rank 0, which trains the MLP probe on a 70/10/20 split of the
(round, client) samples. Caveat: with few clients a sample's client also appears in the probe's training split, so
the probe can recognise clients rather than groups; compare with the chance rate and the number of distinct labels.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch.distributed as dist

from callbacks.privacy import write_attack_file
from resfl_lightning.attacks.aia import aia_success_rate, train_attribute_probe
from resfl_lightning.attacks.outputs import default_head_prefixes
from resfl_lightning.attacks.settings import AttackSettings
from resfl_lightning.attacks.targets import base_data, client_dominant_group
from resfl_lightning.attacks.update_features import update_features
from resfl_lightning.config import ConfigError


class UpdateAttributeInference:
    def __init__(self, settings: AttackSettings, seed: int):
        self.settings, self.seed = settings, int(seed)
        self.rows: list[tuple[int, int, np.ndarray, int]] = []  # (round, client, features, label)
        self.labels: dict[int, int] = {}
        self.segments: list[tuple[str, int]] = []
        self.prefixes: list[str] = []

    def on_fit_start(self, federation, model, layout) -> None:
        s = self.settings.update_aia
        self.segments = layout.segments()
        self.prefixes = list(s.head_prefixes) if s.head_prefixes else default_head_prefixes(model)
        if not any(name.startswith(tuple(self.prefixes)) for name, _ in self.segments):
            raise ConfigError(f"attack.update_aia.head_prefixes: no layer starts with {self.prefixes} "
                              f"(first layers: {[n for n, _ in self.segments[:5]]})")
        self.labels = {cid: client_dominant_group(federation.data, cid) for cid in federation.own_clients()}
        self.rows = []

    def on_client_end(self, federation, round_idx: int, report, delta) -> None:
        feats = update_features(delta, self.segments, head_prefixes=self.prefixes, top_k=self.settings.update_aia.top_k)
        self.rows.append((round_idx, report.client_id, feats.astype(np.float32), self.labels[report.client_id]))

    def _gathered(self, federation) -> list[tuple[int, int, np.ndarray, int]]:
        if federation.fabric.world_size == 1:
            return list(self.rows)
        parts: list = [None] * federation.fabric.world_size
        dist.all_gather_object(parts, self.rows)
        return [row for part in parts for row in part]

    def on_round_end(self, federation, round_idx: int, metrics: dict) -> None:
        if not self.settings.due(round_idx, federation.settings.rounds):
            return
        rows = self._gathered(federation)  # every rank takes part in the collective
        if not federation.fabric.is_global_zero:
            return
        rows.sort(key=lambda r: (r[0], r[1]))
        s = self.settings.update_aia
        metrics["attack/update_aia_n_samples"] = float(len(rows))
        if len(rows) < max(s.min_samples, 10):
            warnings.warn(f"update-aware AIA skipped at round {round_idx}: {len(rows)} client updates collected, "
                          f"the probe needs >= {max(s.min_samples, 10)} (more rounds or clients)", stacklevel=2)
            return
        t0 = time.perf_counter()
        x = np.stack([r[2] for r in rows])
        y = np.array([r[3] for r in rows], dtype=np.int64)
        p = s.probe
        res = train_attribute_probe(x, y, base_data(federation.data).num_groups, self.seed, hidden=p.hidden,
                                    dropout=p.dropout, lr=p.lr, epochs=p.epochs, batch_size=p.batch_size)
        out = {
            "attack/update_aia_top1": res["top1"], "attack/update_aia_macro_f1": res["macro_f1"],
            "attack/update_aia_chance_rate": res["chance_rate"],
            "attack/update_aia_success_rate": aia_success_rate(res),
            "attack/update_aia_n_labels": float(len(np.unique(y))),
            "attack/update_aia_time": time.perf_counter() - t0,
        }
        metrics.update(out)
        write_attack_file(federation, f"update_aia_round_{round_idx:04d}", {
            "metrics": out, "round": round_idx, "head_prefixes": self.prefixes, "top_k": s.top_k,
            "samples": [{"round": r[0], "client": r[1], "label": r[3]} for r in rows],
            "probe": {k: v for k, v in res.items()}})
