"""PrivFairFL (resfl_lightning/baselines/privfairfl.py): Pre perturbs and calibrates the logit layer's update before
upload; Post lets the server calibrate temperatures and per-group thresholds from the clients' aggregate counts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from resfl_lightning.algorithms.base import Algorithm
from resfl_lightning.baselines.privfairfl import LogitPrivacySettings, PostCalibrationSettings
from resfl_lightning.config.fields import setting


@dataclass(kw_only=True)
class PrivFairFLPre(Algorithm):
    logit_privacy: LogitPrivacySettings = setting(doc="clip, noise and calibration of the logit layer's update")

    def client_plugins(self, client: Any, run: Any) -> list:
        from resfl_lightning.baselines.privfairfl import PerturbCalibrate

        return [*super().client_plugins(client, run), PerturbCalibrate(self.logit_privacy)]


@dataclass(kw_only=True)
class PrivFairFLPost(Algorithm):
    post_calibration: PostCalibrationSettings = setting(doc="the grids the clients count on, the server's smoothing")

    def client_plugins(self, client: Any, run: Any) -> list:
        from resfl_lightning.baselines.privfairfl import CalibrationStatistics

        return [*super().client_plugins(client, run), CalibrationStatistics(self.post_calibration)]

    def server_callbacks(self, evaluation: Any) -> list:
        """Calibration before the scores read the test metrics."""
        from resfl_lightning.baselines.post_calibration import PostCalibration

        return [PostCalibration(self.post_calibration, evaluation)]
