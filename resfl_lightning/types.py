"""Types that cross the client/server boundary. A ClientReport is everything a client sends besides its delta."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


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
    dp_epsilon: float = math.nan  # DP-SGD: epsilon this client has spent so far over the run (NaN without DP)
    # DP-SGD: the client's accounting numbers (privacy/dp.py ClientDP.statistics: z, q, steps, NSR, ...); {} without
    dp_statistics: dict[str, float] = field(default_factory=dict)
    # PrivFairFL-Post: aggregate validation counts/sums (per group, per threshold) for server-side calibration;
    # never per-sample values or individual group labels (baselines/privfairfl.py)
    calibration: dict[str, float] = field(default_factory=dict)
    # PUFFLE's fallback: the (G, K + 1) table of per-group parity mass per class and row count of the received model
    # on the training split, noised for epsilon_stat under DP (clients/parity_rates.py); [] otherwise
    parity_counts: list[list[float]] = field(default_factory=list)

    def as_log_dict(self, prefix: str) -> dict[str, float]:
        out = {f"{prefix}/{k}": float(v) for k, v in asdict(self).items() if isinstance(v, (int, float, bool))}
        out.update({f"{prefix}/loss_{k}": v for k, v in self.train_losses.items()})
        out.update({f"{prefix}/time_{k}": v for k, v in self.timings.items()})
        out.update({f"{prefix}/dp_{k}": v for k, v in self.dp_statistics.items()})
        out.pop(f"{prefix}/client_id", None)
        return out
