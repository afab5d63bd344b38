"""pareto.png of the comparison table: utility vs Fairness Score and utility vs Privacy Score, one point per method
with its 95% interval over seeds on both axes."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from resfl_lightning.analysis.figures import series_style  # noqa: E402

PANELS = (("score/fairness", "Fairness Score (lower is fairer)"), ("privacy_score", "Privacy Score (lower leaks less)"))


# Where a label may sit around its point, in points (x, y), with its text alignment; tried in this order.
LABEL_SPOTS = (((4, 4), "left", "bottom"), ((4, -4), "left", "top"), ((-4, 4), "right", "bottom"),
               ((-4, -4), "right", "top"))


def place_labels(points: list[tuple[float, float]], names: list[str], char_w: float = 0.011,
                 line_h: float = 0.045) -> list[int | None]:
    """For each point (axes fractions) the index into LABEL_SPOTS of a label box that overlaps no label placed
    before it, or None (left to the legend), so labels never pile up. Boxes are estimated from the text length."""
    placed: list[tuple[float, float, float, float]] = []
    chosen: list[int | None] = []
    for (x, y), name in zip(points, names):
        w = char_w * len(name)
        pick = None
        for k, ((dx, dy), _, _) in enumerate(LABEL_SPOTS):
            x0 = x if dx > 0 else x - w
            y0 = y if dy > 0 else y - line_h
            box = (x0, y0, x0 + w, y0 + line_h)
            if all(box[2] <= b[0] or box[0] >= b[2] or box[3] <= b[1] or box[1] >= b[3] for b in placed):
                pick = k
                placed.append(box)
                break
        chosen.append(pick)
    return chosen


def legend_entries(axes) -> tuple[list, list[str]]:
    """Every method plotted in any panel, once, in first-seen order: a method with no Fairness Score (n/a) is still
    named when its Privacy Score point's label found no free spot."""
    handles, labels = [], []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    return handles, labels


def _err(iv) -> tuple[list[float], list[float]]:
    if math.isnan(iv.low):
        return [0.0], [0.0]
    return [iv.mean - iv.low], [iv.high - iv.mean]


def plot_pareto(summary: dict, path: Path, title: str = "") -> Path:
    """summary: method -> column -> (Interval, diff) as resfl_lightning.analysis.table.summarise returns it."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, (key, label) in zip(axes, PANELS):
        shown = []
        for i, (method, cols) in enumerate(summary.items()):
            x, y = cols[key][0], cols["utility"][0]
            if math.isnan(x.mean) or math.isnan(y.mean):
                continue
            style = series_style(i)
            ax.errorbar(x.mean, y.mean, xerr=_err(x), yerr=_err(y), fmt=style["marker"], color=style["color"],
                        capsize=3, label=method)
            shown.append((method, x.mean, y.mean))
        ax.get_xlim(), ax.get_ylim()  # settles the lazy autoscaling before reading the transform
        to_axes = ax.transLimits  # data -> axes fraction under the final (autoscaled) limits
        fractions = [tuple(to_axes.transform((x, y))) for _, x, y in shown]
        for (method, x, y), spot in zip(shown, place_labels(fractions, [m for m, _, _ in shown])):
            if spot is not None:
                offset, ha, va = LABEL_SPOTS[spot]
                ax.annotate(method, (x, y), textcoords="offset points", xytext=offset, fontsize=7, ha=ha, va=va)
        ax.set_xlabel(label)
        ax.set_ylabel("utility (mAP@50-95 or accuracy)")
        ax.grid(alpha=0.3)
        if not shown:
            ax.text(0.5, 0.5, "no run reported this metric", ha="center", va="center", transform=ax.transAxes)
    handles, labels = legend_entries(axes)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
