"""The finishing steps every results figure shares (title, legend, grid, layout, file), so they look alike."""

from __future__ import annotations

from pathlib import Path


def save_figure(fig, ax, title: str, path: Path, dpi: int = 130) -> None:
    import matplotlib.pyplot as plt

    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
