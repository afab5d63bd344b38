"""A tests-only attack, plugged in through config alone (tests/unit/attacks/test_registry.py): the settings, the
function that does the work and the callback that decides when, in one module, as docs/design.md describes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resfl_lightning.attacks.base import Attack, AttackRun


@dataclass
class UpdateNormSettings:
    scale: float = 1.0


def scaled_update_norm(delta: torch.Tensor, scale: float) -> float:
    """What a curious server could log about an update: its (scaled) l2 norm."""
    return scale * float(delta.double().norm())


class UpdateNormProbe(Attack):
    """attack.update_norm: records every client update's scaled norm and logs their mean each round."""

    Settings = UpdateNormSettings
    order = 60

    def __init__(self, settings: UpdateNormSettings, seed: int):
        self.settings, self.seed = settings, seed
        self.norms: dict[tuple[int, int], float] = {}

    @classmethod
    def build(cls, settings: UpdateNormSettings, run: AttackRun) -> UpdateNormProbe:
        return cls(settings, run.seed)

    def on_client_end(self, federation, round_idx: int, report, delta) -> None:
        self.norms[(round_idx, report.client_id)] = scaled_update_norm(delta, self.settings.scale)

    def on_round_end(self, federation, round_idx: int, metrics: dict) -> None:
        values = [v for (r, _), v in self.norms.items() if r == round_idx]
        metrics["attack/update_norm"] = sum(values) / len(values)
