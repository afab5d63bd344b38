"""13-condition weather evaluation of the global model: at the last round (and every k rounds), on rank 0.

Adds weather/<condition>_<intensity>/<metric> to the round's metrics, writes weather.json and weather.png into the
run directory and logs the plot (and the table) to W&B when a WandbLogger is attached.

Per-condition privacy: with the privacy attacks configured (and eval.weather_privacy, the default) the MIA and AIA
are re-run on corrupted images under each condition (PrivacyAttacks.condition_metrics) and the rows gain
mia_success_rate, mia_auc, aia_balanced_accuracy, aia_top1, aia_macro_f1, aia_chance_uniform, aia_chance_majority,
aia_n_samples and privacy_score = (MIA SR + AIA balanced accuracy)/2. Only for corrupted images
("synthetic" mode): recorded frames (CARLA's metadata mode) hold too few attack-reserve frames per condition.
Clean-image attack numbers are never copied to the conditions.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from omegaconf import OmegaConf

from resfl_lightning.clients.identity import as_server
from resfl_lightning.config import ConfigError
from resfl_lightning.evaluation.weather import (
    MODES,
    ExtraMetrics,
    condition_indices,
    evaluate_weather,
    image_conditions,
    plot_weather,
    resolve_mode,
    weather_metrics,
    write_weather_json,
)


class WeatherEvaluation:
    """Weather table of the global model at the last round (and every `every` rounds); `extra` adds metrics."""

    def __init__(self, run_dir: Path, every: int | None = None, seed: int = 0, mode: str = "auto",
                 extra: ExtraMetrics | None = None, privacy=None, min_group_size: int = 1):
        if every is not None and int(every) < 1:
            raise ConfigError(f"eval.weather_every: must be null or >= 1, got {every}")
        if mode not in MODES:
            raise ConfigError(f"eval.weather_mode: must be one of {MODES}, got {mode!r}")
        self.run_dir, self.every, self.seed, self.mode, self.extra = Path(run_dir), every, int(seed), mode, extra
        self.privacy = privacy  # a PrivacyAttacks callback: per-condition attacks (synthetic mode only)
        self.min_group_size = int(min_group_size)  # metrics.min_group_size, applied to each condition's images
        self.rows: list[dict] = []

    @classmethod
    def from_config(cls, cfg, run_dir: Path, privacy=None) -> WeatherEvaluation:
        """From cfg.eval (weather_every, weather_seed, weather_mode, weather_privacy); detection datasets only."""
        if cfg.dataset.task != "detection":
            raise ConfigError(f"eval.weather: weather corruptions apply to image detection datasets; dataset "
                              f"{cfg.dataset.name!r} is a {cfg.dataset.task} task")
        ev = cfg.eval
        return cls(run_dir, every=ev.weather_every, seed=ev.weather_seed, mode=ev.weather_mode,
                   privacy=privacy if ev.weather_privacy else None,
                   min_group_size=OmegaConf.select(cfg, "metrics.min_group_size", default=1))  # 1: keys before it

    def due(self, round_idx: int, rounds: int) -> bool:
        return round_idx == rounds - 1 or (self.every is not None and (round_idx + 1) % int(self.every) == 0)

    def on_fit_start(self, federation) -> None:
        """Fail before training, not after the last round, when the test split cannot give the 13 conditions."""
        if federation.fabric.is_global_zero and resolve_mode(federation.data, self.mode) == "metadata":
            condition_indices(image_conditions(federation.data), federation.data.splits.test)
            if self.privacy is not None:
                warnings.warn("weather: recorded conditions (metadata mode) get no per-condition privacy score; the "
                              "privacy attacks run on the attack reserve as recorded", stacklevel=2)

    def on_round_end(self, federation, round_idx: int, model, metrics: dict) -> None:
        fabric = federation.fabric
        if not fabric.is_global_zero or not self.due(round_idx, federation.settings.rounds):
            return
        t0 = time.perf_counter()
        mode = resolve_mode(federation.data, self.mode)
        extras = [self.extra] if self.extra is not None else []
        if self.privacy is not None and mode == "synthetic":
            extras.append(self.privacy.condition_metrics(federation, model, round_idx, self.seed))
        with as_server(model, round_idx):  # the global model: not the client this rank trained last
            self.rows = evaluate_weather(model, federation.data, seed=self.seed, mode=self.mode,
                                         extra=_merged(extras) if extras else None, min_group_size=self.min_group_size)
        metrics.update(weather_metrics(self.rows))
        write_weather_json(self.run_dir / "weather.json", self.rows, round=round_idx, seed=self.seed, split="test",
                           mode=mode, privacy=any(r.get("privacy_score") is not None for r in self.rows))
        png = self.run_dir / "weather.png"
        plot_weather(self.rows, png, title=f"{self.run_dir.name} (round {round_idx + 1})")
        self._log_to_wandb(fabric.loggers, png, round_idx)
        metrics["weather/eval_seconds"] = time.perf_counter() - t0

    def _log_to_wandb(self, loggers, png: Path, step: int) -> None:
        from lightning.pytorch.loggers import WandbLogger

        for logger in loggers:
            if isinstance(logger, WandbLogger):
                logger.log_image(key="weather/plot", images=[str(png)], step=step)
                first = ["condition", "intensity", "n_images"]
                columns = first + sorted({k for r in self.rows for k in r} - set(first))
                logger.log_table(key="weather/table", columns=columns,
                                 data=[[r.get(c) for c in columns] for r in self.rows], step=step)


def _merged(extras: list[ExtraMetrics]) -> ExtraMetrics:
    def metrics(condition: str, intensity: int, loader) -> dict[str, float]:
        out: dict[str, float] = {}
        for extra in extras:
            out.update(extra(condition, intensity, loader))
        return out

    return metrics
