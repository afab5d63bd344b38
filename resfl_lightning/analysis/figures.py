"""The finishing steps every results figure shares (title, legend, grid, layout, file), so they look alike."""

from __future__ import annotations

import textwrap
from pathlib import Path

TITLE_WIDTH = 80  # characters per title line at fontsize 9 on a 6.4-inch figure (a longer line ran off the edge)
MARKERS = "osD^vP*Xh<>p"


def series_style(i: int) -> dict:
    """Colour and marker of the i-th series: ten dark colours, then their light ones, each with its own marker, so
    up to 20 series stay apart (matplotlib's default cycle repeats its colours after ten)."""
    import matplotlib.pyplot as plt

    return {"color": plt.cm.tab20((2 * i) % 20 + (2 * i // 20) % 2), "marker": MARKERS[i % len(MARKERS)]}


def set_title(ax, title: str) -> None:
    """The figure's title, wrapped to TITLE_WIDTH."""
    ax.set_title(textwrap.fill(title, TITLE_WIDTH), fontsize=9)


def save_figure(fig, ax, title: str, path: Path, dpi: int = 130) -> None:
    import matplotlib.pyplot as plt

    set_title(ax, title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
