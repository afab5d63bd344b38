"""The 13-condition weather evaluation (docs/method.md §8): clear + cloud/rain/fog x 25/50/75/100 %.

Two ways to get the images of each condition:
- "synthetic": every test image passes through `apply_weather(image, condition, intensity, weather_seed(seed, id))`
  before letterboxing (works for any image dataset: the built-in benchmark, FACET);
- "metadata": real frames already recorded under each condition (CARLA), grouped by their per-image metadata.
Each condition is scored with the model's own `test_metrics(loader)`; the table, its JSON and a plot shaped like the
paper's weather figure (metric vs intensity, one line per weather type, each starting from the clear value) follow.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from resfl_lightning.data.detection import AnnotatedImages, Annotations
from resfl_lightning.data.weather import WEATHER_CONDITIONS, WEATHER_INTENSITIES, apply_weather, condition_index
from resfl_lightning.evaluation.evaluation_pass import kept_test_metrics

MODES = ("auto", "synthetic", "metadata")
WEATHER_LINES = ("cloud", "rain", "fog")  # one plotted line each, in this order
# Per-condition metrics copied into the run's metrics dict (weather.json keeps every metric test_metrics returns).
LOGGED_METRICS = ("map", "map_50", "map_75", "abs_one_minus_di", "delta_eop", "fairness_score", "ufm", "privacy_score")
# (metric key, axis label): one panel each; privacy only when the table has it.
PLOT_PANELS = (("map", "mAP@50-95"), ("map_50", "mAP@50"), ("fairness_score", "fairness score (lower is fairer)"),
               ("privacy_score", "privacy score (lower is more private)"))
_STYLE = {"cloud": ("tab:gray", "o"), "rain": ("tab:blue", "s"), "fog": ("tab:orange", "^")}

# (condition, intensity, loader) -> further metrics of that condition (e.g. a per-condition privacy score).
ExtraMetrics = Callable[[str, int, Any], dict[str, float]]


def weather_seed(seed: int, image_id: int) -> int:
    """Corruption seed of one image: fixed per (seed, image id), so every condition and intensity of an image share
    one random structure (heavier rain keeps the streaks of lighter rain) whatever the loader order."""
    return int(np.random.SeedSequence([int(seed), int(image_id)]).generate_state(1)[0])


@dataclass
class WeatherImages:
    """An AnnotatedImages source whose image i is apply_weather(source image i, condition, intensity,
    weather_seed(seed, i)); annotations (boxes, groups) are the source's, untouched."""

    source: AnnotatedImages
    condition: str
    intensity: int
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.source, AnnotatedImages):
            raise ValueError(f"source must provide annotations, __len__ and load_image(i); "
                             f"got {type(self.source).__name__}")
        # Validate condition / intensity now, with apply_weather's own rules and messages, not at the first batch.
        apply_weather(np.zeros((1, 1, 3), np.uint8), self.condition, self.intensity)

    @property
    def annotations(self) -> Annotations:
        return self.source.annotations

    def __len__(self) -> int:
        return len(self.source)

    def load_image(self, i: int) -> np.ndarray:
        return apply_weather(self.source.load_image(i), self.condition, self.intensity, weather_seed(self.seed, i))


def weather_loader(data: Any, indices: np.ndarray, condition: str, intensity: int, seed: int = 0):
    """data.loader_for(indices) (no shuffle, no augmentation, the data's batch / image size) over corrupted images."""
    view = copy.copy(data)  # shallow: shares splits and settings, swaps only the image source
    view.source = WeatherImages(data.source, condition, int(intensity), seed)
    return view.loader_for(np.asarray(indices, dtype=np.int64))


def image_conditions(data: Any) -> np.ndarray | None:
    """Per-image index into WEATHER_CONDITIONS from recorded metadata (CARLA's image_meta), or None when the data
    records no weather. Looked up on data.source, data.source.records (real_detection), data.records, data."""
    source = getattr(data, "source", None)
    for holder in (source, getattr(source, "records", None), getattr(data, "records", None), data):
        meta = getattr(holder, "image_meta", None)
        if not meta:
            continue
        if "condition" in meta:
            return np.asarray(meta["condition"], dtype=np.int64)
        if "weather" in meta and "intensity" in meta:
            return np.array([condition_index(w, i) for w, i in zip(meta["weather"], meta["intensity"], strict=True)],
                            dtype=np.int64)
    return None


def resolve_mode(data: Any, mode: str = "auto") -> str:
    """'metadata' when the data records per-image weather (and mode allows it), else 'synthetic'."""
    if mode not in MODES:
        raise ValueError(f"weather mode must be one of {MODES}, got {mode!r}")
    has_meta = image_conditions(data) is not None
    if mode == "metadata" and not has_meta:
        raise ValueError("weather mode 'metadata' needs per-image weather metadata (image_meta 'condition' or "
                         "'weather' + 'intensity', as CARLA records); this dataset has none: use 'synthetic'")
    if mode == "auto":
        return "metadata" if has_meta else "synthetic"
    return mode


def condition_indices(conditions: np.ndarray, indices: np.ndarray) -> list[np.ndarray]:
    """indices split by recorded condition, in WEATHER_CONDITIONS order; ValueError naming conditions with no image."""
    indices = np.asarray(indices, dtype=np.int64)
    if len(indices) and indices.max() >= len(conditions):
        raise ValueError(f"image index {int(indices.max())} has no recorded weather ({len(conditions)} images have)")
    parts = [indices[conditions[indices] == k] for k in range(len(WEATHER_CONDITIONS))]
    missing = [f"{w}_{i}" for (w, i), p in zip(WEATHER_CONDITIONS, parts) if len(p) == 0]
    if missing:
        raise ValueError(f"the evaluation split has no frame recorded under {missing}; the 13-condition evaluation "
                         "needs every condition (or use weather mode 'synthetic')")
    return parts


def evaluate_weather(model: Any, data: Any, *, indices: Sequence[int] | np.ndarray | None = None, seed: int = 0,
                     mode: str = "auto", extra: ExtraMetrics | None = None, min_group_size: int = 1
                     ) -> list[dict[str, Any]]:
    """One row per condition (WEATHER_CONDITIONS order): condition, intensity, n_images, then model.test_metrics.

    indices defaults to the test split; `extra(condition, intensity, loader)` may add metrics to each row. A group
    with fewer persons than min_group_size among a condition's images is left out of that row's group metrics.
    """
    indices = np.asarray(data.splits.test if indices is None else indices, dtype=np.int64)
    if len(indices) == 0:
        raise ValueError("the weather evaluation got no images (empty test split?)")
    mode = resolve_mode(data, mode)
    parts = condition_indices(image_conditions(data), indices) if mode == "metadata" else None
    rows = []
    for k, (condition, intensity) in enumerate(WEATHER_CONDITIONS):
        if parts is not None:
            chosen, loader = parts[k], data.loader_for(parts[k])
        else:
            chosen, loader = indices, weather_loader(data, indices, condition, intensity, seed)
        row: dict[str, Any] = {"condition": condition, "intensity": intensity, "n_images": len(chosen)}
        row.update({key: float(v) for key, v in kept_test_metrics(model, loader, min_group_size).items()})
        if extra is not None:
            row.update({key: float(v) for key, v in extra(condition, intensity, loader).items()})
        rows.append(row)
    return rows


def _by_condition(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    table = {(r["condition"], int(r["intensity"])): r for r in rows}
    missing = [f"{w}_{i}" for w, i in WEATHER_CONDITIONS if (w, i) not in table]
    if missing or len(table) != len(rows):
        raise ValueError(f"a weather table needs exactly one row per condition; missing {missing}, "
                         f"{len(rows)} rows for {len(table)} distinct conditions")
    return table


def weather_metrics(rows: Sequence[dict[str, Any]], keys: Sequence[str] = LOGGED_METRICS) -> dict[str, float]:
    """weather/<condition>_<intensity>/<metric> for each row, plus weather/adverse_mean/<metric> over the 12 non-clear
    conditions (NaN when any of them is NaN)."""
    table = _by_condition(rows)
    out: dict[str, float] = {}
    for (w, i), row in table.items():
        out.update({f"weather/{w}_{i}/{k}": float(row[k]) for k in keys if k in row})
    adverse = [row for (w, _), row in table.items() if w != "clear"]
    for k in keys:
        if all(k in row for row in adverse):
            out[f"weather/adverse_mean/{k}"] = float(np.mean([row[k] for row in adverse]))
    return out


def _jsonable(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write_weather_json(path: Path, rows: Sequence[dict[str, Any]], **info: Any) -> Path:
    """{**info, "conditions": rows} with non-finite numbers as null."""
    _by_condition(rows)
    payload = {**info, "conditions": [{k: _jsonable(v) for k, v in r.items()} for r in rows]}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2))
    return path


def plot_weather(rows: Sequence[dict[str, Any]], path: Path | None = None, title: str | None = None):
    """Metric vs intensity (0-100 %), one line per weather type starting at the clear value, one panel per metric.

    Returns the matplotlib Figure (Agg canvas, no pyplot state); saves it to `path` when given.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    table = _by_condition(rows)
    panels = [(key, label) for key, label in PLOT_PANELS if all(key in r for r in rows)]
    if not panels:
        raise ValueError(f"the weather table has none of the plotted metrics {[k for k, _ in PLOT_PANELS]}")
    clear = table[("clear", 0)]
    fig = Figure(figsize=(4.0 * len(panels), 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (key, label) in zip(axes, panels):
        for weather in WEATHER_LINES:
            ys = [clear[key]] + [table[(weather, i)][key] for i in WEATHER_INTENSITIES[1:]]
            colour, marker = _STYLE[weather]
            ax.plot(WEATHER_INTENSITIES, [np.nan if v is None else v for v in ys], color=colour, marker=marker,
                    label=weather)
        if not any(math.isfinite(float(np.nan if r[key] is None else r[key])) for r in rows):
            # e.g. DI = 0/0 when no group has a true positive: say so instead of leaving a blank panel
            ax.text(0.5, 0.5, f"{key} undefined\nunder every condition", transform=ax.transAxes, ha="center",
                    va="center", color="0.4")
        ax.set_xticks(WEATHER_INTENSITIES)
        ax.set_xlabel("weather intensity (%)")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0])
        ax.grid(alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), title="condition", loc="outside right upper")
    if title:
        fig.suptitle(title)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig
