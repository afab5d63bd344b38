"""Partitioning by sensitive group: IID-stratified and Dirichlet client shards, stratified splits, H_TV
(docs/method.md §8).

Everything works on per-item group labels (0..G-1, -1 = unknown, which is kept as a stratum of its own);
for detection datasets use image_groups() to get one label per image first.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from resfl_lightning.config.errors import ConfigError

Seed = int | np.random.Generator
PARTITIONS = ("iid", "dirichlet", "column")
SMALL_CLIENT_RULES = ("warn", "error", "merge", "drop")
MIN_TRAIN_ROWS = 2  # BatchNorm in train mode needs two rows (data/tabular.py)
_NAMES_SHOWN = 20


def count_from_fraction(num_clients: int, fraction: float) -> int:
    """round(fraction * N) with halves rounded up (Python's round() would send 2.5 to 2): how many of N clients (or
    rows) a fraction picks, e.g. the attackers, the skewed clients, the poisoned rows."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    return min(num_clients, int(math.floor(fraction * num_clients + 0.5 + 1e-9)))


class SmallClientWarning(UserWarning):
    """A client has too few items for its train / validation split (named in the message)."""


def _groups_array(groups: np.ndarray | list[int]) -> np.ndarray:
    g = np.asarray(groups)
    if g.ndim != 1 or (g.size and g.dtype.kind not in "iu"):
        raise ValueError(f"groups must be a 1-D integer array, got dtype {g.dtype} shape {g.shape}")
    if g.size and g.min() < -1:
        raise ValueError(f"group labels must be >= -1 (-1 = unknown), got {int(g.min())} at item {int(g.argmin())}")
    return g.astype(np.int64)


def _has_duplicates(items: np.ndarray) -> bool:
    """Whether a 1-D array repeats a value: a sort and a neighbour comparison (numpy 2's hash-based `np.unique` takes
    seconds on the millions of distinct indices of 10,000 virtual clients)."""
    ordered = np.sort(items)
    return bool(np.any(ordered[1:] == ordered[:-1]))


def _check_clients(num_clients: int, n: int) -> None:
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if n < num_clients:
        raise ConfigError(f"dataset.num_clients: cannot split {n} items into {num_clients} non-empty client shards",
                          "dataset.num_clients")


def image_groups(image_index: np.ndarray, groups: np.ndarray, n_images: int) -> np.ndarray:
    """One group per image: the most frequent known group of its objects (ties: the one listed first); -1 if none."""
    image_index, groups = np.asarray(image_index, np.int64), _groups_array(groups)
    if image_index.shape != groups.shape:
        raise ValueError(f"image_index {image_index.shape} and groups {groups.shape} must have the same length")
    if image_index.size and (image_index.min() < 0 or image_index.max() >= n_images):
        raise ValueError(f"image index out of range 0..{n_images - 1}")
    out = np.full(n_images, -1, np.int64)
    known = np.flatnonzero(groups >= 0)
    if known.size == 0:
        return out
    width = int(groups.max()) + 1
    keys = image_index[known] * width + groups[known]
    pair, first, counts = np.unique(keys, return_index=True, return_counts=True)
    img, grp = pair // width, pair % width
    order = np.lexsort((first, -counts, img))  # per image: highest count, then earliest row
    img, grp = img[order], grp[order]
    lead = np.r_[True, img[1:] != img[:-1]]
    out[img[lead]] = grp[lead]
    return out


def iid_stratified_shards(groups: np.ndarray | list[int], num_clients: int, seed: Seed) -> list[np.ndarray]:
    """Equal-size shards (+-1 item) that each keep the global group mix (+-1 item per group)."""
    g = _groups_array(groups)
    _check_clients(num_clients, len(g))
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(g))
    order = order[np.argsort(g[order], kind="stable")]  # grouped by label, random inside each group
    # Dealing the grouped sequence round-robin gives every client floor/ceil of each group and of the total.
    owner = rng.permutation(num_clients)[np.arange(len(g)) % num_clients]
    # One stable sort by owner instead of a mask per client: O(n log n), not O(num_clients x n) (10,000 clients).
    bounds = np.cumsum(np.bincount(owner, minlength=num_clients))[:-1]
    return [np.sort(part) for part in np.split(order[np.argsort(owner, kind="stable")], bounds)]


def _capped_multinomial(rng: np.random.Generator, n: int, p: np.ndarray, available: np.ndarray) -> np.ndarray:
    """n_g ~ Multinomial(n, p) without exceeding `available`; overflow is redrawn over groups that still have items
    (p renormalised over them; proportional to what is left when p puts no mass there)."""
    take = np.zeros_like(available)
    need = n
    while need > 0:
        left = available - take
        w = np.where(left > 0, p, 0.0)
        if not np.isfinite(w).all() or w.sum() <= 0:
            w = left.astype(np.float64)
        draw = np.minimum(rng.multinomial(need, w / w.sum()), left)
        take += draw
        need -= int(draw.sum())
    return take


def dirichlet_shards(groups: np.ndarray | list[int], num_clients: int, alpha: float, seed: Seed,
                     centre: str = "uniform") -> list[np.ndarray]:
    """Equal-size shards (+-1) with group mix p_i ~ Dirichlet(alpha 1_G), n_ig ~ Multinomial(n_i, p_i)
    (docs/method.md §8).

    Clients are filled in a random order; when a group runs out, its share is redrawn over the groups left.
    centre="global" draws p_i ~ Dirichlet(alpha G p_global) instead (same total concentration, mean p_global), so
    large alpha tends to IID also on imbalanced data; the method's "uniform" (docs/method.md §8) centres every client
    on equal group shares.
    """
    if not alpha > 0:
        raise ValueError(f"Dirichlet alpha must be > 0, got {alpha}")
    if centre not in ("uniform", "global"):
        raise ValueError(f"Dirichlet centre must be 'uniform' or 'global', got {centre!r}")
    g = _groups_array(groups)
    _check_clients(num_clients, len(g))
    rng = np.random.default_rng(seed)
    cats, inv = np.unique(g, return_inverse=True)
    pools = [rng.permutation(np.flatnonzero(inv == k)) for k in range(len(cats))]
    available = np.array([len(p) for p in pools], np.int64)
    sizes = len(g) // num_clients + (rng.permutation(num_clients) < len(g) % num_clients)
    used = np.zeros(len(cats), np.int64)
    shards: list[np.ndarray] = [np.empty(0, np.int64)] * num_clients
    if centre == "uniform":
        concentration = np.full(len(cats), float(alpha))
    else:
        concentration = float(alpha) * len(cats) * available / available.sum()
    for i in rng.permutation(num_clients):
        p = rng.dirichlet(concentration)
        take = _capped_multinomial(rng, int(sizes[i]), p, available - used)
        parts = [pools[k][used[k] : used[k] + take[k]] for k in range(len(cats))]
        used += take
        shards[i] = np.sort(np.concatenate(parts)).astype(np.int64)
    return shards


def h_tv(shards: list[np.ndarray], groups: np.ndarray | list[int]) -> float:
    """H_TV = mean_i 0.5 ||p_i - p_global||_1, p_global = group mix over the union of the shards."""
    g = _groups_array(groups)
    if not shards:
        raise ValueError("h_tv needs at least one shard")
    for i, s in enumerate(shards):
        if len(s) == 0:
            raise ValueError(f"client {i} has an empty shard; its group distribution is undefined")
    cats = np.unique(g[np.concatenate(shards)])
    hist = np.stack([np.bincount(np.searchsorted(cats, g[s]), minlength=len(cats)) for s in shards])
    p = hist / hist.sum(1, keepdims=True)
    p_global = hist.sum(0) / hist.sum()
    return float(np.mean(0.5 * np.abs(p - p_global).sum(1)))


def stratified_split(indices: np.ndarray | list[int], groups: np.ndarray | list[int], fraction: float,
                     seed: Seed) -> tuple[np.ndarray, np.ndarray]:
    """Split `indices` (positions into the full `groups` array) into (rest, held) with held ~ fraction of each group.

    held has round(fraction * len(indices)) items; each group contributes floor or ceil of fraction * its count
    (largest remainders first, ties broken at random).
    """
    return _stratified_split(indices, _groups_array(groups), fraction, seed)


def _stratified_split(indices: np.ndarray | list[int], g_all: np.ndarray, fraction: float,
                      seed: Seed) -> tuple[np.ndarray, np.ndarray]:
    """stratified_split with `g_all` already checked (_groups_array): make_federated_splits checks the groups once,
    not once per client (a copy of every item's group per client is O(clients x items))."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"split fraction must be in [0, 1), got {fraction}")
    idx = np.asarray(indices, np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= len(g_all)):
        raise ValueError(f"indices out of range for {len(g_all)} items")
    if _has_duplicates(idx):
        raise ValueError("indices contain duplicates")
    rng = np.random.default_rng(seed)
    cats, inv = np.unique(g_all[idx], return_inverse=True)
    counts = np.bincount(inv, minlength=len(cats))
    quota = fraction * counts
    held_n = np.floor(quota).astype(np.int64)
    extra = int(round(fraction * len(idx))) - int(held_n.sum())
    if extra > 0:
        frac_part = quota - held_n
        order = np.lexsort((rng.random(len(cats)), -frac_part))  # largest remainder first, random tie-break
        held_n[order[:extra]] += 1
    held = [rng.permutation(idx[inv == k])[: held_n[k]] for k in range(len(cats))]
    held_idx = np.sort(np.concatenate(held)) if held else np.empty(0, np.int64)
    rest_idx = np.setdiff1d(np.sort(idx), held_idx, assume_unique=True)  # = setdiff1d(idx, held): both unique
    return rest_idx.astype(np.int64), held_idx.astype(np.int64)


def column_shards(labels: np.ndarray) -> tuple[list[str], list[np.ndarray]]:
    """Natural partition: one shard per distinct value of `labels` (sorted), the positions holding it."""
    labels = np.asarray(labels).astype(str)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"partition column values must be a non-empty 1-D array, got shape {labels.shape}")
    names, inverse = np.unique(labels, return_inverse=True)
    return [str(n) for n in names], [np.flatnonzero(inverse == k) for k in range(len(names))]


def split_shortfall(n_items: int, val_fraction: float, min_train: int = MIN_TRAIN_ROWS) -> str:
    """Why a shard of n_items cannot give a validation split and min_train training items ('' when it can)."""
    n_val = int(round(val_fraction * n_items))  # what stratified_split holds out
    problems = []
    if val_fraction > 0 and n_val == 0:
        problems.append("no validation item")
    if n_items - n_val < min_train:
        problems.append(f"{n_items - n_val} training item(s), fewer than {min_train}")
    return f"{n_items} items: " + " and ".join(problems) if problems else ""


def _named(names: list[str], small: list[int], shortfall: list[str]) -> str:
    shown = [f"client {names[i]!r} ({shortfall[i]})" for i in small[:_NAMES_SHOWN]]
    more = len(small) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more else "")


def resolve_small_clients(shards: list[np.ndarray], names: list[str], val_fraction: float, rule: str,
                          min_train: int = MIN_TRAIN_ROWS) -> tuple[list[np.ndarray], list[str]]:
    """Apply dataset.small_clients to the shards too small for their splits: error (ConfigError naming them), warn
    (kept, named in a SmallClientWarning), drop (their items unused) or merge (pooled into one client, which joins
    the smallest other client if still too small); the last two warn naming the clients."""
    if rule not in SMALL_CLIENT_RULES:
        raise ValueError(f"small_clients must be one of {', '.join(SMALL_CLIENT_RULES)}, got {rule!r}")
    shortfall = [split_shortfall(len(s), val_fraction, min_train) for s in shards]
    small = [i for i, why in enumerate(shortfall) if why]
    if not small:
        return shards, names
    named = _named(names, small, shortfall)
    advice = f"val_fraction={val_fraction}: {len(small)} of {len(shards)} clients are too small for their splits"
    if rule == "error":
        raise ConfigError(f"dataset.small_clients=error, {advice}: {named}. Use fewer clients, or "
                          "dataset.small_clients=warn | merge | drop (merge / drop with partition=column)",
                          "dataset.small_clients")
    small_set = set(small)
    keep = [i for i in range(len(shards)) if i not in small_set]
    if rule == "warn":
        warnings.warn(f"{advice} (their validation utility and u are not measured): {named}", SmallClientWarning,
                      stacklevel=3)
        return shards, names
    if rule == "drop":
        if not keep:
            raise ConfigError(f"dataset.small_clients=drop would drop every client ({advice}: {named})",
                              "dataset.small_clients")
        warnings.warn(f"dropped ({advice}; their items are unused): {named}", SmallClientWarning, stacklevel=3)
        return [shards[i] for i in keep], [names[i] for i in keep]
    pooled = np.sort(np.concatenate([shards[i] for i in small]))
    pooled_name = "+".join(names[i] for i in small)
    out_shards, out_names = [shards[i] for i in keep], [names[i] for i in keep]
    j = len(out_shards)  # the client the pooled items join: a new one, or the smallest other when still too small
    if split_shortfall(len(pooled), val_fraction, min_train):
        if not out_shards:
            raise ValueError(f"dataset.small_clients=merge: all clients together are still too small ({advice}: "
                             f"{named})")
        j = int(np.argmin([len(s) for s in out_shards]))
        out_shards[j] = np.sort(np.concatenate([out_shards[j], pooled]))
        out_names[j] = f"{out_names[j]}+{pooled_name}"
    else:
        out_shards.append(pooled)
        out_names.append(pooled_name)
    warnings.warn(f"merged ({advice}) into client {out_names[j]!r}: {named}", SmallClientWarning, stacklevel=3)
    return out_shards, out_names


@dataclass(frozen=True)
class ClientSplit:
    """One client's local train and validation indices."""

    train: np.ndarray
    val: np.ndarray


@dataclass(frozen=True)
class FederatedSplits:
    """Disjoint test / attack-reserve / per-client (train, val) index sets, plus how they were made."""

    test: np.ndarray
    reserve: np.ndarray
    clients: list[ClientSplit]
    partition: str
    alpha: float | None
    seed: int
    h_tv: float
    """Group heterogeneity of the client shards (train + val), mean_i 0.5 ||p_i - p_global||_1."""
    client_names: tuple[str, ...] = ()
    """partition=column: the partition column's value(s) of each client."""

    def __post_init__(self) -> None:
        parts = [self.test, self.reserve] + [a for c in self.clients for a in (c.train, c.val)]
        everything = np.concatenate(parts) if parts else np.empty(0, np.int64)
        if _has_duplicates(everything):
            raise ValueError("federated splits overlap: test, reserve and client train/val sets must be disjoint")

    def client_indices(self, i: int) -> np.ndarray:
        """All of client i's items (train + val)."""
        return np.sort(np.concatenate([self.clients[i].train, self.clients[i].val]))

    def sizes(self) -> dict[str, int | float]:
        """Counts for logging: test, reserve, per-client train/val and totals, plus H_TV."""
        out: dict[str, int | float] = {"test": len(self.test), "reserve": len(self.reserve),
                                       "num_clients": len(self.clients)}
        for i, c in enumerate(self.clients):
            out[f"client{i}/train"], out[f"client{i}/val"] = len(c.train), len(c.val)
        out["train_total"] = sum(len(c.train) for c in self.clients)
        out["val_total"] = sum(len(c.val) for c in self.clients)
        out["h_tv"] = self.h_tv
        return out


def make_federated_splits(groups: np.ndarray | list[int], num_clients: int, test_fraction: float = 0.2,
                          reserve_fraction: float = 0.05, val_fraction: float = 0.1, partition: str = "iid",
                          alpha: float = 0.5, seed: int = 0, dirichlet_centre: str = "uniform",
                          client_labels: np.ndarray | None = None, small_clients: str = "warn",
                          min_train: int = MIN_TRAIN_ROWS) -> FederatedSplits:
    """Test split, then the attack reserve (reserve_fraction of all items), both stratified by group; the rest is
    sharded over clients ("iid" stratified, "dirichlet", or "column": one client per value of `client_labels`, the
    per-item partition column), and each shard gets a stratified train/val split. Shards too small for their splits
    are handled by `small_clients` (resolve_small_clients)."""
    g = _groups_array(groups)
    n = len(g)
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}, got {partition!r}")
    if partition == "column" and (client_labels is None or len(client_labels) != n):
        raise ValueError(f"partition=column needs one partition-column value per item ({n}), got "
                         f"{None if client_labels is None else len(client_labels)}")
    if partition != "column" and small_clients in ("merge", "drop"):
        raise ValueError(f"small_clients={small_clients} needs partition=column (iid / dirichlet clients are made "
                         "equal-sized from num_clients); use error or warn")
    if not (0 <= test_fraction < 1 and 0 <= reserve_fraction < 1 and test_fraction + reserve_fraction < 1):
        raise ValueError(f"need 0 <= test_fraction, reserve_fraction and their sum < 1, got "
                         f"{test_fraction}, {reserve_fraction}")
    # One independent stream per stage, so changing e.g. val_fraction does not reshuffle the test split.
    stage = [np.random.default_rng([seed, k]) for k in range(4)]
    pool, test = stratified_split(np.arange(n), g, test_fraction, stage[0])
    n_reserve = int(round(reserve_fraction * n))
    pool, reserve = stratified_split(pool, g, n_reserve / len(pool) if len(pool) else 0.0, stage[1])
    names: list[str] = []
    if partition == "iid":
        local = iid_stratified_shards(g[pool], num_clients, stage[2])
    elif partition == "dirichlet":
        local = dirichlet_shards(g[pool], num_clients, alpha, stage[2], centre=dirichlet_centre)
    else:
        names, local = column_shards(np.asarray(client_labels)[pool])
    shards = [pool[s] for s in local]
    shown = names or [str(i) for i in range(len(shards))]
    shards, shown = resolve_small_clients(shards, shown, val_fraction, small_clients, min_train)
    clients = [ClientSplit(*_stratified_split(s, g, val_fraction, stage[3])) for s in shards]
    return FederatedSplits(test=test, reserve=reserve, clients=clients, partition=partition,
                           alpha=alpha if partition == "dirichlet" else None, seed=seed, h_tv=h_tv(shards, g),
                           client_names=tuple(shown) if partition == "column" else ())
