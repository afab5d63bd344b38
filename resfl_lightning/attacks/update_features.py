"""Update-aware AIA features (docs/method.md §7): summarise one client's round update as a fixed-length vector.

Vector layout for L layers: [l2 norm per layer (L), sign ratio per layer (L), top-k |delta| layer histogram (L),
head mean, head std, head abs-max (3)], length 3L + 3. The MLP probe of `aia.py` then predicts the client's
dominant group from these vectors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

Layout = Sequence[tuple[str, int]]


def _as_flat_tensor(x: Any, name: str) -> torch.Tensor:
    t = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if not (t.is_floating_point()):
        raise ValueError(f"{name}: expected a floating-point update, got dtype {t.dtype}")
    return t.reshape(-1).to(device="cpu", dtype=torch.float64)


def _numel(v: Any) -> int:
    return int(v.numel()) if hasattr(v, "numel") else int(np.asarray(v).size)


def _is_float(v: Any) -> bool:
    return v.is_floating_point() if isinstance(v, torch.Tensor) else np.asarray(v).dtype.kind == "f"


def _float_items(mapping: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Floating entries only: integer buffers (e.g. BatchNorm num_batches_tracked) are not part of an update."""
    return [(str(k), v) for k, v in mapping.items() if _is_float(v)]


def _pairs(layout: Layout | Mapping[str, Any]) -> list[tuple[str, int]]:
    """[(name, numel)] from a name -> tensor mapping (floating entries) or a sequence of (name, numel)."""
    if isinstance(layout, Mapping):
        return [(k, _numel(v)) for k, v in _float_items(layout)]
    pairs = []
    for i, item in enumerate(layout):
        if len(item) != 2:
            raise ValueError(f"layout[{i}]: expected (name, numel), got {item!r}")
        pairs.append((str(item[0]), int(item[1])))
    return pairs


def resolve_layout(
    update: Any, layout: Layout | Mapping[str, Any] | None = None
) -> tuple[torch.Tensor, list[tuple[str, int]]]:
    """Normalise (update, layout) to a flat float64 CPU tensor and a [(name, numel)] list.

    Accepts a flat update plus a layout (a list of (name, numel) or a name -> tensor mapping giving the shapes), or a
    name -> tensor mapping of per-layer updates with layout None. Non-floating mapping entries are skipped.
    """
    if isinstance(update, Mapping):
        if layout is not None:
            raise ValueError("pass either a mapping update (layout=None) or a flat update with a layout, not both")
        items = _float_items(update)
        if not items:
            raise ValueError("update mapping has no floating-point entries")
        pairs = _pairs(update)
        flat = torch.cat([_as_flat_tensor(v, f"update[{k!r}]") for k, v in items])
        return flat, pairs
    if layout is None:
        raise ValueError("a flat update needs a layout: a list of (name, numel) or a name -> tensor mapping")
    pairs = _pairs(layout)
    if not pairs:
        raise ValueError("layout is empty")
    for name, numel in pairs:
        if numel < 0:
            raise ValueError(f"layout entry {name!r}: negative numel {numel}")
    flat = _as_flat_tensor(update, "update")
    total = sum(n for _, n in pairs)
    if flat.numel() != total:
        raise ValueError(f"update has {flat.numel()} entries but the layout sums to {total}")
    return flat, pairs


def update_feature_names(layout: Layout | Mapping[str, Any]) -> list[str]:
    """Column names matching `update_features` for this layout (or per-layer update mapping)."""
    names = [n for n, _ in _pairs(layout)]
    return ([f"l2/{n}" for n in names] + [f"sign_pos/{n}" for n in names] + [f"topk_hist/{n}" for n in names]
            + ["head/mean", "head/std", "head/absmax"])


def update_features(
    update: Any,
    layout: Layout | Mapping[str, Any] | None = None,
    *,
    head_prefixes: Sequence[str],
    top_k: int = 1000,
) -> np.ndarray:
    """Fixed-length float64 vector (3L + 3) describing one client's update (see module docstring).

    sign ratio = fraction of strictly positive entries; the top-k histogram counts, per layer, how many of the k
    largest-|delta| entries fall there, divided by k (k capped at the update size). Head statistics are taken over
    the entries of every layer whose name starts with one of `head_prefixes`; none matching is an error.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if isinstance(head_prefixes, str):
        head_prefixes = (head_prefixes,)
    flat, pairs = resolve_layout(update, layout)
    if not torch.all(torch.isfinite(flat)):
        raise ValueError(f"update contains {int((~torch.isfinite(flat)).sum())} non-finite entries")
    n_layers = len(pairs)
    sizes = torch.tensor([n for _, n in pairs], dtype=torch.long)
    layer_of = torch.repeat_interleave(torch.arange(n_layers), sizes)  # layer index of every flat entry

    sq = torch.zeros(n_layers, dtype=torch.float64).index_add_(0, layer_of, flat * flat)
    pos = torch.zeros(n_layers, dtype=torch.float64).index_add_(0, layer_of, (flat > 0).to(torch.float64))
    l2 = sq.sqrt()
    sign_ratio = torch.where(sizes > 0, pos / sizes.clamp(min=1).to(torch.float64), torch.zeros_like(pos))

    k = min(top_k, flat.numel())
    hist = torch.zeros(n_layers, dtype=torch.float64)
    if k > 0:
        top_idx = torch.topk(flat.abs(), k, sorted=False).indices
        hist.index_add_(0, layer_of[top_idx], torch.ones(k, dtype=torch.float64))
        hist /= k

    head_mask = torch.tensor([any(n.startswith(p) for p in head_prefixes) for n, _ in pairs])
    if not bool(head_mask.any()):
        raise ValueError(f"no layer name starts with any head prefix {list(head_prefixes)} "
                         f"(first names: {[n for n, _ in pairs[:5]]})")
    head = flat[head_mask[layer_of]]
    if head.numel() == 0:
        head_stats = torch.zeros(3, dtype=torch.float64)
    else:
        head_stats = torch.stack([head.mean(), head.std(unbiased=False), head.abs().max()])
    return torch.cat([l2, sign_ratio, hist, head_stats]).numpy()


def dominant_group(groups: Any, num_groups: int) -> int:
    """Most frequent known group (ignoring -1) among a client's persons; ties go to the lower index."""
    g = np.asarray(groups.detach().cpu() if hasattr(groups, "detach") else groups).reshape(-1).astype(np.int64)
    g = g[g >= 0]
    if g.size == 0:
        raise ValueError("dominant_group: no person with a known group")
    if g.max() >= num_groups:
        raise ValueError(f"dominant_group: group {int(g.max())} outside 0..{num_groups - 1}")
    return int(np.argmax(np.bincount(g, minlength=num_groups)))
