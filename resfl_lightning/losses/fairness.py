"""L_fair of the PUFFLE / PFU-FL / PrivFairFL-Pre baselines (docs/method.md §5): distance between group feature
means."""

from __future__ import annotations

import itertools

import torch


def group_mean_distance(features: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """mean over pairs (g, g') of present groups of ||mu_g - mu_g'||_2, mu_g = mean feature of group g's rows.

    Rows with group -1 (unknown) are ignored. With fewer than two groups in the batch there is no pair: the result is
    a graph-connected 0, so every step has the same graph."""
    groups = groups.reshape(-1).long()
    if features.dim() != 2 or features.shape[0] != groups.shape[0]:
        raise ValueError(f"group_mean_distance: features {tuple(features.shape)} and groups {tuple(groups.shape)} "
                         "must share the first dimension")
    present = [int(g) for g in torch.unique(groups[groups >= 0]).tolist()]
    if len(present) < 2:
        return features.sum() * 0.0
    means = torch.stack([features[groups == g].mean(dim=0) for g in present])
    dists = [torch.linalg.vector_norm(means[a] - means[b]) for a, b in itertools.combinations(range(len(present)), 2)]
    return torch.stack(dists).mean()
