"""The built-in attacks' settings (the keys under attack.<name> in conf/attack/*.yaml), checked on construction.

Each dataclass is the `Settings` of one attack class (resfl_lightning/attacks/base.py); the registry fills it from
the attack's config node, so an unknown key or a value of the wrong type is reported with its dotted key there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resfl_lightning.attacks.byzantine import RELATIVE_STRENGTHS, REPORT_MODES, is_strength
from resfl_lightning.attacks.poisoning import MODES
from resfl_lightning.config import ConfigError

MIA_METHODS = ("shadow", "lira", "rmia")  # shadow: the paper's attack; lira / rmia: reference models (docs §7)


@dataclass
class ProbeSettings:
    """The two-layer MLP attribute probe (docs/method.md, attacks)."""

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
    method: str = "shadow"  # shadow | lira | rmia
    references: int = 4  # lira / rmia: reference models, in complementary pairs (even)
    rmia_gamma: float = 1.0  # RMIA: LR(x, z) >= gamma counts z as dominated by x
    rmia_offline_a: float = 1.0  # RMIA's offline correction of p(x); 1: the plain mean over the references
    per_client: bool = False  # lira / rmia: also each client's own leakage and the round of peak leakage
    audit: str | None = None  # lira | rmia beside the shadow attack, in the same run: keys attack/mia_audit_*

    def __post_init__(self) -> None:
        if self.method not in MIA_METHODS:
            raise ConfigError(f"attack.mia.method: must be one of {list(MIA_METHODS)}, got {self.method!r}")
        if self.audit is not None and (self.audit not in MIA_METHODS[1:] or self.method != "shadow"):
            raise ConfigError(f"attack.mia.audit: lira or rmia beside attack.mia.method=shadow (with method=lira / "
                              f"rmia the run's MIA is already that audit), got audit={self.audit!r} with method="
                              f"{self.method!r}")
        if self.per_client and self.reference_method is None:
            raise ConfigError("attack.mia.per_client: needs attack.mia.method=lira or rmia, or attack.mia.audit "
                              "(per-example scores)")
        if self.references < 2 or self.references % 2:
            raise ConfigError(f"attack.mia.references: must be even and >= 2 (complementary pairs), got "
                              f"{self.references}")
        if not (self.rmia_gamma > 0 and 0 < self.rmia_offline_a <= 1):
            raise ConfigError(f"attack.mia.rmia_gamma, rmia_offline_a: must be > 0 and in (0, 1], got "
                              f"{self.rmia_gamma}, {self.rmia_offline_a}")
        a, b = self.shadow_member_fraction, self.shadow_nonmember_fraction
        if not (0 < a and 0 < b and a + b < 1):
            raise ConfigError("attack.mia.shadow_member_fraction, shadow_nonmember_fraction: must be > 0 and sum to "
                              f"< 1 (the rest are target non-members), got {a}, {b}")
        if self.calibration not in ("sigmoid", "isotonic"):
            raise ConfigError(f"attack.mia.calibration: must be sigmoid or isotonic, got {self.calibration!r}")

    @property
    def reference_method(self) -> str | None:
        """The run's reference-model attack (lira / rmia): the MIA itself, or the audit beside the shadow; None."""
        return self.audit if self.method == "shadow" else self.method


@dataclass
class AiaSettings:
    boxes: str = "matched"  # matched | ground_truth
    score_threshold: float = 0.25  # detections entering the fairness matching
    min_matched: int = 20  # fewer matched persons than this -> ROIs at the ground-truth person boxes instead
    probe: ProbeSettings = field(default_factory=ProbeSettings)

    def __post_init__(self) -> None:
        if self.boxes not in ("matched", "ground_truth"):
            raise ConfigError(f"attack.aia.boxes: must be matched or ground_truth, got {self.boxes!r}")


@dataclass
class UpdateAiaSettings:
    top_k: int = 1000
    head_prefixes: list[str] | None = None  # null: the model's detection head (or its last layer)
    min_samples: int = 10  # fewest shadow updates the probe trains on
    shadow_clients: int = 6  # shadow clients simulated from the reserve each round (the probe's training set)
    shadow_client_size: int | None = None  # items per shadow client; null: an average real client's training split
    shadow_alpha: float = 0.5  # Dirichlet concentration of the shadow clients' group mixes
    probe: ProbeSettings = field(default_factory=ProbeSettings)

    def __post_init__(self) -> None:
        if self.shadow_clients < 1 or (self.shadow_client_size is not None and self.shadow_client_size < 1):
            raise ConfigError(f"attack.update_aia.shadow_clients, shadow_client_size: must be >= 1, got "
                              f"{self.shadow_clients}, {self.shadow_client_size}")
        if not self.shadow_alpha > 0:
            raise ConfigError(f"attack.update_aia.shadow_alpha: must be > 0, got {self.shadow_alpha}")


@dataclass
class ByzantineSettings:
    fraction: float = 0.25
    gamma: float | int | str = 1.0  # a number, or relative to the attack's n and f: n_over_f | h_over_2f (byzantine.py)
    l2_bound: float | None = None
    include_buffers: bool = False  # flip BatchNorm running statistics too (can make variances negative)
    report: str = "honest"  # honest | sent | lie: what an attacker reports as u (attacks/byzantine.py)

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise ConfigError(f"attack.byzantine.fraction: must be in [0, 1], got {self.fraction}")
        if not is_strength(self.gamma):
            raise ConfigError(f"attack.byzantine.gamma: must be > 0 or one of {list(RELATIVE_STRENGTHS)}, got "
                              f"{self.gamma!r}")
        if self.l2_bound is not None and not self.l2_bound > 0:
            raise ConfigError(f"attack.byzantine.l2_bound: must be null or > 0, got {self.l2_bound}")
        if self.report not in REPORT_MODES:
            raise ConfigError(f"attack.byzantine.report: must be one of {list(REPORT_MODES)}, got {self.report!r}")


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

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise ConfigError(f"attack.poisoning.fraction: must be in [0, 1], got {self.fraction}")
        if self.mode not in MODES:
            raise ConfigError(f"attack.poisoning.mode: must be one of {list(MODES)}, got {self.mode!r}")
        if not 0 <= self.rate <= 1:
            raise ConfigError(f"attack.poisoning.rate: must be in [0, 1], got {self.rate}")
        if self.start_round < 0 or (self.length is not None and self.length < 0):
            raise ConfigError(f"attack.poisoning.start_round, length: must be >= 0, got {self.start_round}, "
                              f"{self.length}")


@dataclass
class EodSettings:
    protected_group: int | None = None  # null: attack.poisoning.target_group, without poisoning the smallest group
    unprotected_group: int | None = None  # null: every other known group, pooled
