"""DP-SGD methods (FedAvg-DP, PUFFLE, PFU-FL): per-example clipping and Gaussian noise on every client (opacus;
resfl_lightning/privacy/dp.py), with the client's budget planned over federation.rounds x local_epochs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from resfl_lightning.algorithms.base import Algorithm
from resfl_lightning.config.fields import setting
from resfl_lightning.privacy.dp import DPConfig, DPSettings


@dataclass(kw_only=True)
class DPSGD(Algorithm):
    per_sample_clipping = True

    dp: DPConfig = setting(doc="per-example DP-SGD: clip, noise, accountant")

    def attach(self, client: Any, run: Any) -> Any:
        """A GroupNorm model (privacy/groupnorm.py's rule), set before any gradient exists so every client and the
        global model share one layout, then the plug-ins (DP-SGD's hooks and accountant on that model)."""
        from resfl_lightning.privacy.dp import prepare_model

        client.model = prepare_model(client.model, self.dp.groupnorm_groups)
        if hasattr(client, "criterion"):  # the detection loss reads the (new) model's head geometry
            client.criterion = type(client.criterion)(client.model)
        return super().attach(client, run)

    def client_plugins(self, client: Any, run: Any) -> list:
        return [*self.dp_plugins(client, run), *super().client_plugins(client, run)]

    def dp_plugins(self, client: Any, run: Any) -> list:
        """DP-SGD's ClientDP on the client's (GroupNorm) model. `dp.enabled=false`: none, the GroupNorm model
        trained as FedAvg trains (the layout's ablation)."""
        if not self.dp.enabled:
            return []
        from resfl_lightning.privacy.dp import ClientDP

        settings = DPSettings(**{f.name: getattr(self.dp, f.name) for f in dataclasses.fields(self.dp)},
                              rounds=run.federation.rounds, local_epochs=run.federation.local_epochs)
        return [ClientDP(settings, client.model)]
