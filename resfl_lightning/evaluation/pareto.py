"""pareto.png of the comparison table: utility vs Fairness Score and utility vs Privacy Score, one point per method
with its 95% interval over seeds on both axes."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PANELS = (("score/fairness", "Fairness Score (lower is fairer)"), ("privacy_score", "Privacy Score (lower leaks less)"))
MARKERS = "osD^vP*Xh<>p"


def labels_that_fit(points: list[tuple[float, float]], min_dx: float = 0.2, min_dy: float = 0.05) -> list[bool]:
    """Which points get a text label: greedily, a label whose point lies closer than (min_dx, min_dy) (axes
    fractions) to an already labelled point is left out, so labels never pile up; the legend names every point."""
    placed: list[tuple[float, float]] = []
    keep = []
    for x, y in points:
        fits = all(abs(x - px) >= min_dx or abs(y - py) >= min_dy for px, py in placed)
        keep.append(fits)
        if fits:
            placed.append((x, y))
    return keep


def _err(iv) -> tuple[list[float], list[float]]:
    if math.isnan(iv.low):
        return [0.0], [0.0]
    return [iv.mean - iv.low], [iv.high - iv.mean]


def plot_pareto(summary: dict, path: Path, title: str = "") -> Path:
    """summary: method -> column -> (Interval, diff) as resfl_lightning.table.summarise returns it."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, (key, label) in zip(axes, PANELS):
        shown = []
        for i, (method, cols) in enumerate(summary.items()):
            x, y = cols[key][0], cols["utility"][0]
            if math.isnan(x.mean) or math.isnan(y.mean):
                continue
            color = plt.cm.tab20((2 * i) % 20 + (2 * i // 20) % 2)  # ten dark colours, then their light ones
            ax.errorbar(x.mean, y.mean, xerr=_err(x), yerr=_err(y), fmt=MARKERS[i % len(MARKERS)], color=color,
                        capsize=3, label=method)
            shown.append((method, x.mean, y.mean))
        ax.get_xlim(), ax.get_ylim()  # settles the lazy autoscaling before reading the transform
        to_axes = ax.transLimits  # data -> axes fraction under the final (autoscaled) limits
        fractions = [tuple(to_axes.transform((x, y))) for _, x, y in shown]
        for (method, x, y), keep in zip(shown, labels_that_fit(fractions)):
            if keep:
                ax.annotate(method, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set_xlabel(label)
        ax.set_ylabel("utility (mAP@50-95 or accuracy)")
        ax.grid(alpha=0.3)
        if not shown:
            ax.text(0.5, 0.5, "no run reported this metric", ha="center", va="center", transform=ax.transAxes)
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
