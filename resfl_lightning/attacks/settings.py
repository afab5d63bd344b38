"""Attack configuration (conf/attack/*.yaml) as validated dataclasses; errors name the key."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from resfl_lightning.attacks.byzantine import REPORT_MODES
from resfl_lightning.attacks.poisoning import MODES
from resfl_lightning.config import ConfigError

ATTACKS = ("mia", "aia", "update_aia", "byzantine", "poisoning", "eod")


# --- settings ----------------------------------------------------------------------------------------------------
@dataclass
class ProbeSettings:
    """The two-layer MLP attribute probe of SPEC §7."""

    hidden: int = 128
    dropout: float = 0.1
    lr: float = 1e-3
    epochs: int = 10
    batch_size: int = 256


@dataclass
class MiaSettings:
    """Reserve = shadow members | shadow non-members | held-back target non-members (fractions of the reserve)."""

    shadow_member_fraction: float = 1 / 3
    shadow_nonmember_fraction: float = 1 / 3
    score_threshold: float = 0.25  # tau: the post-NMS detections the features describe
    calibration: str = "sigmoid"


@dataclass
class AiaSettings:
    boxes: str = "matched"  # matched | ground_truth
    score_threshold: float = 0.25  # detections entering the fairness matching
    min_matched: int = 20  # fewer matched persons than this -> ROIs at the ground-truth person boxes instead
    probe: ProbeSettings = field(default_factory=ProbeSettings)


@dataclass
class UpdateAiaSettings:
    top_k: int = 1000
    head_prefixes: list[str] | None = None  # null: the model's detection head (or its last layer)
    min_samples: int = 10  # fewest shadow updates the probe trains on
    shadow_clients: int = 6  # shadow clients simulated from the reserve each round (the probe's training set)
    shadow_client_size: int | None = None  # items per shadow client; null: an average real client's training split
    shadow_alpha: float = 0.5  # Dirichlet concentration of the shadow clients' group mixes
    probe: ProbeSettings = field(default_factory=ProbeSettings)


@dataclass
class ByzantineSettings:
    fraction: float = 0.25
    gamma: float = 1.0
    l2_bound: float | None = None
    include_buffers: bool = False  # flip BatchNorm running statistics too (can make variances negative)
    report: str = "honest"  # honest | sent | lie: what an attacker reports as u (attacks/byzantine.py)


@dataclass
class PoisoningSettings:
    fraction: float = 0.25
    target_group: int = 2
    mode: str = "drop"  # drop | mislabel | relabel_group
    rate: float = 1.0  # fraction of the target group's boxes poisoned on a poisoned client
    other_group: int | None = None  # relabel_group: the group the target persons are relabelled to
    mislabel_class: int | None = None  # mislabel: the (non-person) class given to the target persons
    start_round: int = 0
    length: int | None = None  # rounds in the block; null = until the end of training


@dataclass
class EodSettings:
    protected_group: int | None = None  # null: poisoning.target_group
    unprotected_group: int | None = None  # null: every other known group, pooled


@dataclass
class AttackSettings:
    enabled: tuple[str, ...] = ()
    every: int | None = None  # also run MIA / AIA every k rounds (always after the last round)
    mia: MiaSettings = field(default_factory=MiaSettings)
    aia: AiaSettings = field(default_factory=AiaSettings)
    update_aia: UpdateAiaSettings = field(default_factory=UpdateAiaSettings)
    byzantine: ByzantineSettings = field(default_factory=ByzantineSettings)
    poisoning: PoisoningSettings = field(default_factory=PoisoningSettings)
    eod: EodSettings = field(default_factory=EodSettings)

    def __post_init__(self) -> None:
        unknown = [a for a in self.enabled if a not in ATTACKS]
        if unknown:
            raise ConfigError(f"attack.enabled: unknown attack(s) {unknown}; choose from {list(ATTACKS)}")
        if self.every is not None and self.every < 1:
            raise ConfigError(f"attack.every must be null or >= 1, got {self.every}")
        m = self.mia
        if not (0 < m.shadow_member_fraction and 0 < m.shadow_nonmember_fraction
                and m.shadow_member_fraction + m.shadow_nonmember_fraction < 1):
            raise ConfigError("attack.mia.shadow_member_fraction / shadow_nonmember_fraction must be > 0 and sum to "
                              f"< 1 (the rest are target non-members), got {m.shadow_member_fraction}, "
                              f"{m.shadow_nonmember_fraction}")
        if m.calibration not in ("sigmoid", "isotonic"):
            raise ConfigError(f"attack.mia.calibration must be sigmoid or isotonic, got {m.calibration!r}")
        if self.aia.boxes not in ("matched", "ground_truth"):
            raise ConfigError(f"attack.aia.boxes must be matched or ground_truth, got {self.aia.boxes!r}")
        b = self.byzantine
        if not 0 <= b.fraction <= 1:
            raise ConfigError(f"attack.byzantine.fraction must be in [0, 1], got {b.fraction}")
        if not (b.gamma > 0 and math.isfinite(b.gamma)):
            raise ConfigError(f"attack.byzantine.gamma must be > 0, got {b.gamma}")
        if b.l2_bound is not None and not b.l2_bound > 0:
            raise ConfigError(f"attack.byzantine.l2_bound must be null or > 0, got {b.l2_bound}")
        if b.report not in REPORT_MODES:
            raise ConfigError(f"attack.byzantine.report must be one of {list(REPORT_MODES)}, got {b.report!r}")
        ua = self.update_aia
        if ua.shadow_clients < 1 or (ua.shadow_client_size is not None and ua.shadow_client_size < 1):
            raise ConfigError(f"attack.update_aia.shadow_clients / shadow_client_size must be >= 1, got "
                              f"{ua.shadow_clients}, {ua.shadow_client_size}")
        if not ua.shadow_alpha > 0:
            raise ConfigError(f"attack.update_aia.shadow_alpha must be > 0, got {ua.shadow_alpha}")
        p = self.poisoning
        if not 0 <= p.fraction <= 1:
            raise ConfigError(f"attack.poisoning.fraction must be in [0, 1], got {p.fraction}")
        if p.mode not in MODES:
            raise ConfigError(f"attack.poisoning.mode must be one of {list(MODES)}, got {p.mode!r}")
        if not 0 <= p.rate <= 1:
            raise ConfigError(f"attack.poisoning.rate must be in [0, 1], got {p.rate}")
        if p.start_round < 0 or (p.length is not None and p.length < 0):
            raise ConfigError(f"attack.poisoning.start_round / length must be >= 0, got {p.start_round}, {p.length}")

    def on(self, name: str) -> bool:
        return name in self.enabled

    @property
    def protected_group(self) -> int:
        return self.poisoning.target_group if self.eod.protected_group is None else self.eod.protected_group

    def due(self, round_idx: int, rounds: int) -> bool:
        """MIA / AIA rounds: the last round, and every `every` rounds when set."""
        return round_idx == rounds - 1 or (self.every is not None and (round_idx + 1) % self.every == 0)


def _build(cls: type, values: Mapping[str, Any] | None, path: str) -> Any:
    """Dataclass from a config mapping; an unknown key is a ConfigError naming it."""
    values = dict(values or {})
    kwargs = {}
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key, val in values.items():
        if key not in names:
            raise ConfigError(f"{path}.{key}: unknown setting; known: {sorted(names)}")
        sub = names[key].default_factory if names[key].default_factory is not dataclasses.MISSING else None
        kwargs[key] = _build(sub, val, f"{path}.{key}") if dataclasses.is_dataclass(sub) else val
    return cls(**kwargs)


def attack_settings(node: Any) -> AttackSettings:
    """AttackSettings from the `attack` config node (DictConfig or mapping; None = nothing enabled)."""
    if node is None:
        return AttackSettings()
    if hasattr(node, "_metadata"):  # DictConfig
        from omegaconf import OmegaConf

        node = OmegaConf.to_container(node, resolve=True)
    values = dict(node)
    values["enabled"] = tuple(values.get("enabled") or ())
    return _build(AttackSettings, values, "attack")
