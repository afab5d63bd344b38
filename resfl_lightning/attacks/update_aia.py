"""Update-aware attribute inference (docs/method.md §7): from the updates it receives, the server guesses each client's
dominant group, with a probe trained only on updates it simulated itself.

Shadow clients: the server cuts its attack reserve into a few shadow clients with seeded group mixes (a Dirichlet
draw per client, its largest share moved to group k mod G so every group dominates some shadow client) and, each
round, trains each of them from the round's global model with the run's recipe. Their updates, summarised by
`update_features` and labelled with the shadow client's dominant group, are the probe's training set; the real
clients' updates (labelled with their true dominant group, evaluation ground truth the server never receives) are
only its test set. Under IID shards every real client has the same dominant group, so there is nothing to infer:
the attack reports itself not applicable (NaN) instead of a chance rate of 1.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from resfl_lightning.attacks.aia import MIN_TRAIN_TEST_SAMPLES, aia_success_rate, train_test_attribute_probe
from resfl_lightning.attacks.settings import UpdateAiaSettings
from resfl_lightning.attacks.targets import (
    client_dominant_group,
    isolated_rng,
    item_groups,
    items_dominant_group,
    stream_seed,
    train_loader_for,
)
from resfl_lightning.attacks.update_features import update_features
from resfl_lightning.data.federated import base_data

_SHADOW_CLIENT_STREAM = 0x534843
SCORES = ("balanced_accuracy", "top1", "macro_f1", "chance_uniform", "chance_majority")


def shadow_client_sets(reserve: np.ndarray, reserve_groups: np.ndarray, num_groups: int, count: int, size: int,
                       alpha: float, seed: int) -> list[np.ndarray]:
    """`count` disjoint-within-client item sets drawn from the reserve with seeded group mixes.

    Client k draws p ~ Dirichlet(alpha 1_G), swaps its largest share onto group k mod G, then n_g ~ Multinomial(size, p)
    items of item-group g without replacement (all of them when the reserve holds fewer). Items without a known group
    are never drawn.
    """
    reserve, reserve_groups = np.asarray(reserve, np.int64), np.asarray(reserve_groups, np.int64)
    if reserve.shape != reserve_groups.shape:
        raise ValueError(f"reserve has {reserve.size} items but {reserve_groups.size} groups")
    if count < 1 or size < 1 or not alpha > 0:
        raise ValueError(f"shadow clients need count >= 1, size >= 1, alpha > 0; got {count}, {size}, {alpha}")
    pools = [reserve[reserve_groups == g] for g in range(num_groups)]
    sets = []
    for k in range(count):
        rng = np.random.default_rng(stream_seed(seed, _SHADOW_CLIENT_STREAM, k))
        p = rng.dirichlet(np.full(num_groups, float(alpha)))
        top, target = int(np.argmax(p)), k % num_groups
        p[[top, target]] = p[[target, top]]
        n = rng.multinomial(size, p)
        parts = [rng.choice(pool, size=min(int(n_g), pool.size), replace=False) for pool, n_g in zip(pools, n)]
        items = np.sort(np.concatenate(parts))
        if items.size == 0:
            raise ValueError(f"shadow client {k}: the reserve holds no item of the groups its mix drew")
        sets.append(items)
    return sets


def real_client_labels(data: Any) -> dict[int, int]:
    """Every real client's dominant training group (evaluation ground truth; the same on every rank)."""
    return {cid: client_dominant_group(data, cid) for cid in range(base_data(data).num_clients)}


def applicable(labels: dict[int, int]) -> bool:
    """The attack has something to infer only when the real clients' dominant groups differ."""
    return len(set(labels.values())) >= 2


class ShadowClients:
    """Shadow clients trained each round from the global model with the run's recipe; returns their update features.

    One extra client module (built by the run's client factory) is replayed for every shadow client, like a rank
    replays its real clients; each shadow client's local state (e.g. its adversary) is kept between its rounds.
    """

    def __init__(self, federation: Any, sets: list[np.ndarray], seed: int, segments: list[tuple[str, int]],
                 head_prefixes: list[str], top_k: int):
        self.federation, self.sets, self.seed = federation, sets, int(seed)
        self.segments, self.prefixes, self.top_k = segments, head_prefixes, top_k
        data = base_data(federation.data)
        self.labels = [items_dominant_group(data, s) for s in sets]
        self.client = None
        self.local_states: dict[int, Any] = {}

    def round_updates(self, layout: Any, theta: torch.Tensor, int_buffers: dict, round_idx: int) -> np.ndarray:
        """(count, d) update-feature rows of every shadow client trained from theta in round `round_idx`."""
        from resfl_lightning.federation.local import local_train

        fed = self.federation
        fabric, s = fed.fabric, fed.settings
        rows = []
        with isolated_rng(fabric.device):
            if self.client is None:
                torch.manual_seed(stream_seed(self.seed, _SHADOW_CLIENT_STREAM))
                self.client = fabric.to_device(fed.client_factory())
            for k, items in enumerate(self.sets):
                cid = -(k + 1)  # negative ids: never a real client
                rseed = stream_seed(self.seed, _SHADOW_CLIENT_STREAM, k, round_idx + 1)
                layout.load(self.client, theta, int_buffers)
                self.client.import_local_state(self.local_states.get(k), seed=stream_seed(self.seed, k))
                torch.manual_seed(rseed)
                self.client.begin_client(cid, round_idx)
                local_train(fabric, self.client, lambda epoch, rs=rseed, it=items: train_loader_for(fed.data, it,
                                                                                                    rs + epoch),
                            s.local_epochs, lr_factor=s.lr_factor(round_idx), name=f"shadow client {k}, round "
                            f"{round_idx}", sam_rho=s.sam_rho)
                self.local_states[k] = {n: v.detach().clone() for n, v in self.client.export_local_state().items()}
                delta = layout.flatten(self.client) - theta
                rows.append(update_features(delta, self.segments, head_prefixes=self.prefixes, top_k=self.top_k))
        return np.stack(rows).astype(np.float32)


def update_attribute_inference(shadow_x: np.ndarray, shadow_y: np.ndarray, real_x: np.ndarray, real_y: np.ndarray,
                               num_groups: int, seed: int, settings: UpdateAiaSettings,
                               is_applicable: bool) -> dict[str, Any]:
    """attack/update_aia_* metrics: the probe fitted on shadow updates only, scored on the real clients' updates.

    Not applicable (IID: one dominant group among the real clients), too few shadow updates so far, or fewer than two
    shadow labels: every score is NaN and `attack/update_aia_applicable` is 0.
    """
    out: dict[str, Any] = {"attack/update_aia_n_samples": float(len(real_y)),
                           "attack/update_aia_n_shadow_samples": float(len(shadow_y)),
                           "attack/update_aia_n_labels": float(len(np.unique(real_y))),
                           "attack/update_aia_n_shadow_labels": float(len(np.unique(shadow_y)))}
    enough = len(shadow_y) >= max(settings.min_samples, MIN_TRAIN_TEST_SAMPLES) and len(real_y) > 0
    usable = is_applicable and enough and len(np.unique(shadow_y)) >= 2
    out["attack/update_aia_applicable"] = float(usable)
    if not usable:
        out.update({f"attack/update_aia_{k}": math.nan for k in (*SCORES, "success_rate")})
        return {"metrics": out, "probe": None}
    p = settings.probe
    res = train_test_attribute_probe(shadow_x, shadow_y, real_x, real_y, num_groups, seed, hidden=p.hidden,
                                     dropout=p.dropout, lr=p.lr, epochs=p.epochs, batch_size=p.batch_size)
    out.update({f"attack/update_aia_{k}": float(res[k]) for k in SCORES})
    out["attack/update_aia_success_rate"] = aia_success_rate(res)
    return {"metrics": out, "probe": res}


def plan_shadow_clients(federation: Any, settings: UpdateAiaSettings, seed: int, segments: list[tuple[str, int]],
                        head_prefixes: list[str]) -> ShadowClients:
    """The run's shadow clients: `shadow_clients` sets from the reserve, each the size of an average real client's
    training split (or `shadow_client_size`)."""
    data = base_data(federation.data)
    reserve = np.asarray(data.splits.reserve, np.int64)
    size = settings.shadow_client_size or int(round(np.mean([data.num_train(c) for c in range(data.num_clients)])))
    groups = item_groups(data)[reserve]
    sets = shadow_client_sets(reserve, groups, data.num_groups, settings.shadow_clients, size, settings.shadow_alpha,
                              seed)
    return ShadowClients(federation, sets, seed, segments, head_prefixes, settings.top_k)
