"""Types that cross the client/server boundary. A ClientReport is everything a client sends besides its delta."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class ClientReport:
    """Scalars a client sends to the server each round: no data, no group labels, no per-sample values."""

    client_id: int
    num_samples: int
    ufm_raw: float  # this round's UFM before EMA / clip / gate
    ufm_ema: float  # EMA state after this round (equals ufm_raw when EMA is off)
    u: float  # reported uncertainty-fairness value after clip and gate
    gated: bool  # True when val mAP@50-95 (or accuracy) was under the gate and u was set to the upper clip
    val_utility: float  # val mAP@50-95 for detection, accuracy for classification
    val_utility50: float  # val mAP@50 (detection) or accuracy again (classification)
    eval_loss: float
    fim_eigenvalue: float = math.nan
    ufm_se: float = math.nan  # bootstrap standard error of ufm_raw on the validation split
    val_delta_eop: float = math.nan  # validation ΔEOP of the reported model (the UFM mechanism check uses it)
    train_losses: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # A method's own entries, written by its client plug-ins (clients/plugin.py ClientPlugin.report) and read by
    # its server side: scalars or aggregate counts (e.g. DP-SGD's spent epsilon, privacy/report.py), never
    # per-sample values or individual group labels
    extras: dict[str, Any] = field(default_factory=dict)

    def as_log_dict(self, prefix: str) -> dict[str, float]:
        """The fields, the scalar extras (tables and mappings are the server's, not logged), the mean losses and the
        timings as <prefix>/<key> metrics."""
        scalars = {**{f.name: getattr(self, f.name) for f in fields(self)}, **self.extras}
        out = {f"{prefix}/{k}": float(v) for k, v in scalars.items() if isinstance(v, (int, float, bool))}
        out.update({f"{prefix}/loss_{k}": v for k, v in self.train_losses.items()})
        out.update({f"{prefix}/time_{k}": v for k, v in self.timings.items()})
        out.pop(f"{prefix}/client_id", None)
        return out
