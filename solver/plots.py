"""The solver's plots as PNG bytes without dates (same data, same bytes).

matplotlib is imported inside each function: the solver runs without it,
and only the plots are then lost.
"""

from __future__ import annotations

import io
from typing import Any


def step_plot_png(al: list[float], bp: list[float] | None, title: str) -> bytes:
    """A line plot of accuracy per step (AL vs BP), as PNG bytes without dates."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = list(range(1, len(al) + 1))
    ax.plot(steps, al, marker="o", label="AL (analytic)")
    if bp is not None:
        ax.plot(steps, bp, marker="s", label="BP head")
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy over seen tasks (%)")
    ax.set_xticks(steps)
    ax.set_ylim(0, 102)  # room for markers at 100 %
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    return _png(fig)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def steps_png(report: dict[str, Any], title: str) -> bytes:
    """Mean accuracy over seen tasks per step, each row shaded mean ± std."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, row in report["rows"].items():
        stats = row["step_accuracy"]
        steps = list(range(1, len(stats) + 1))
        mean = [s["mean"] for s in stats]
        (line,) = ax.plot(steps, mean, marker="o", label=report["labels"][name])
        if all(s["std"] is not None for s in stats):
            lo = [s["mean"] - s["std"] for s in stats]
            hi = [s["mean"] + s["std"] for s in stats]
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy over seen tasks (%)")
    ax.set_xticks(steps)
    ax.set_ylim(0, 102)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=7, wrap=True)
    fig.tight_layout()
    return _png(fig)


def matrix_png(matrix: list[list[float]], title: str) -> bytes:
    """The accuracy matrix (step × task) as an annotated heatmap."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    K = len(matrix)
    grid = np.full((K, K), np.nan)
    for k, row in enumerate(matrix):
        grid[k, : len(row)] = row
    fig = Figure(figsize=(5, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis")
    for k, row in enumerate(matrix):
        for i, a in enumerate(row):
            ax.text(i, k, f"{a:.0f}", ha="center", va="center", fontsize=8, color="w")
    ax.set_xticks(range(K), [str(i) for i in range(1, K + 1)])
    ax.set_yticks(range(K), [str(k) for k in range(1, K + 1)])
    ax.set_xlabel("task")
    ax.set_ylabel("after step")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, label="accuracy (%)")
    fig.tight_layout()
    return _png(fig)
