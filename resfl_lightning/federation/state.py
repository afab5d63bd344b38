"""The global model as one flat fp32 vector (parameters + float buffers) plus untouched integer buffers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class FlatLayout:
    """Which state-dict entries live in the flat vector, in order, and which integer buffers ride alongside."""

    float_keys: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    int_keys: tuple[str, ...]

    @classmethod
    def of(cls, module: nn.Module) -> FlatLayout:
        """Every state-dict entry except the module's client-local ones (`is_local_key`, e.g. the adversary)."""
        is_local = getattr(module, "is_local_key", lambda name: False)
        sd = {k: v for k, v in module.state_dict().items() if not is_local(k)}
        float_keys = tuple(k for k, v in sd.items() if v.is_floating_point())
        int_keys = tuple(k for k, v in sd.items() if not v.is_floating_point())
        return cls(float_keys, tuple(sd[k].shape for k in float_keys), int_keys)

    @property
    def numel(self) -> int:
        return sum(s.numel() for s in self.shapes)

    def segments(self) -> list[tuple[str, int]]:
        """(name, numel) per entry: the per-layer slicing of a flat update."""
        return [(k, s.numel()) for k, s in zip(self.float_keys, self.shapes)]

    def parameter_mask(self, module: nn.Module) -> torch.Tensor:
        """Bool mask over the flat vector: True on trainable parameters, False on float buffers (BatchNorm running
        statistics: not part of any gradient)."""
        params = {n for n, _ in module.named_parameters()}
        return torch.cat([torch.full((int(shape.numel()),), key in params, dtype=torch.bool)
                          for key, shape in zip(self.float_keys, self.shapes)])

    def flatten(self, module: nn.Module) -> torch.Tensor:
        sd = module.state_dict()
        return torch.cat([sd[k].detach().reshape(-1).to(torch.float32) for k in self.float_keys])

    def int_buffers(self, module: nn.Module) -> dict[str, torch.Tensor]:
        sd = module.state_dict()
        return {k: sd[k].detach().clone() for k in self.int_keys}

    @torch.no_grad()
    def load(self, module: nn.Module, flat: torch.Tensor, int_buffers: dict[str, torch.Tensor]) -> None:
        """Write theta into the module in place (parameters keep their identity, so optimizers stay valid)."""
        if flat.numel() != self.numel:
            raise ValueError(f"flat state has {flat.numel()} values, layout expects {self.numel}")
        sd = module.state_dict(keep_vars=True)
        offset = 0
        for k, shape in zip(self.float_keys, self.shapes):
            n = shape.numel()
            sd[k].data.copy_(flat[offset: offset + n].view(shape).to(sd[k].dtype))
            offset += n
        for k, v in int_buffers.items():
            sd[k].data.copy_(v)
