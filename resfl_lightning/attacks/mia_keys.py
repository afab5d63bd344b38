"""The summary keys of the membership attacks: the run's MIA (attack/mia_*) and the reference-model audit that
attack.mia.audit runs beside the shadow attack in the same run (attack/mia_audit_*)."""

from __future__ import annotations

MIA_PREFIX = "attack/mia_"
AUDIT_PREFIX = "attack/mia_audit_"


def audit_key(key: str) -> str:
    """attack/mia_<name> of a reference attack -> attack/mia_audit_<name>, its key beside the shadow attack's."""
    if not key.startswith(MIA_PREFIX):
        raise ValueError(f"not a membership-attack key (attack/mia_*): {key!r}")
    return AUDIT_PREFIX + key.removeprefix(MIA_PREFIX)
