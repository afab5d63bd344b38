"""The GroupNorm a DP model uses in place of each BatchNorm (docs/method.md §5, "GroupNorm rule").

BatchNorm mixes the samples of a batch, so per-example gradients (and their clipping) are undefined with it; GroupNorm
normalises each sample alone. The number of groups G of a C-channel layer is a rule (`algorithm.dp.groupnorm_groups`):

- `min32_c4` (default): G = the largest divisor of C that is <= min(32, max(1, C // 4)): at most 32 groups (the
  GroupNorm paper's default) and at least 4 channels per group wherever C >= 4, so no narrow layer becomes an
  InstanceNorm (one channel per group, the GroupNorm paper's worst setting).
- `opacus`: G = gcd(32, C), opacus' `ModuleValidator.fix` (one channel per group for C = 16 or 32).

A BatchNorm1d (a feature vector after a linear layer) becomes GroupNorm(1, C) under both rules: with few features per
group each would be normalised to its bias (our reading, kept from before the rule).
"""

from __future__ import annotations

import math

from torch import nn

GROUPNORM_RULES = ("min32_c4", "opacus")


def groupnorm_groups(channels: int, rule: str = "min32_c4") -> int:
    """Groups of the GroupNorm that replaces a C-channel BatchNorm2d/3d under `rule` (a divisor of C)."""
    if channels < 1:
        raise ValueError(f"a normalisation layer needs channels >= 1, got {channels}")
    if rule == "opacus":
        return math.gcd(32, channels)
    if rule == "min32_c4":
        target = min(32, max(1, channels // 4))
        return max(g for g in range(1, target + 1) if channels % g == 0)
    raise ValueError(f"algorithm.dp.groupnorm_groups: unknown rule {rule!r}; choose one of {GROUPNORM_RULES}")


def replace_batchnorm(original: nn.Module, fixed: nn.Module, rule: str) -> None:
    """In `fixed` (opacus' fix of `original`, BatchNorms already GroupNorms), set each former BatchNorm's GroupNorm by
    the rule: GroupNorm(1, C) after a BatchNorm1d, else `groupnorm_groups(C, rule)` groups. Fresh layers as opacus
    builds them (weight 1, bias 0); a BatchNorm1d keeps its eps (as before the rule)."""
    for name, module in original.named_modules():
        if not isinstance(module, nn.modules.batchnorm._BatchNorm):
            continue
        parent, _, child = name.rpartition(".")
        owner = fixed.get_submodule(parent) if parent else fixed
        c = module.num_features
        if isinstance(module, nn.BatchNorm1d):
            setattr(owner, child, nn.GroupNorm(1, c, eps=module.eps, affine=module.affine))
        elif rule != "opacus":  # opacus' own fix already built gcd(32, C) groups
            setattr(owner, child, nn.GroupNorm(groupnorm_groups(c, rule), c, affine=module.affine))
