"""The solver's plots, and their plumbing that `pal-paper` draws with too: an
off-screen figure, its PNG bytes without dates (same data, same bytes), a
series drawn as mean ± std.

matplotlib is imported inside each function: the solver runs without it
(its callers catch ImportError and skip the plot, with a warning).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any


def new_figure(width: float, height: float) -> Any:
    """A matplotlib Figure of width x height inches at 100 dpi, drawn by Agg
    (no display, no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Any) -> bytes:
    """The figure as PNG bytes, without matplotlib's version stamp, so the
    same figure gives the same bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def mean_std_line(
    ax: Any, stats: Sequence[Mapping[str, float | None]], label: str
) -> list[int]:
    """Plot `stats` (one {"mean", "std"} per step) against steps 1..n with
    markers; shade mean ± std in the line's colour when every step has a std
    (a single run has none). Returns the steps."""
    steps = list(range(1, len(stats) + 1))
    mean = [s["mean"] for s in stats]
    (line,) = ax.plot(steps, mean, marker="o", label=label)
    if all(s["std"] is not None for s in stats):
        lo = [s["mean"] - s["std"] for s in stats]
        hi = [s["mean"] + s["std"] for s in stats]
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15)
    return steps


def step_plot_png(al: list[float], bp: list[float] | None, title: str) -> bytes:
    """One chain's accuracy per step (AL vs BP), as PNG bytes."""
    fig = new_figure(6, 4)
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
    return png_bytes(fig)


def steps_png(report: dict[str, Any], title: str) -> bytes:
    """Mean accuracy over seen tasks per step, each row shaded mean ± std."""
    fig = new_figure(7, 4.5)
    ax = fig.add_subplot()
    for name, row in report["rows"].items():
        steps = mean_std_line(ax, row["step_accuracy"], report["labels"][name])
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy over seen tasks (%)")
    ax.set_xticks(steps)
    ax.set_ylim(0, 102)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=7, wrap=True)
    fig.tight_layout()
    return png_bytes(fig)


def matrix_png(matrix: list[list[float]], title: str) -> bytes:
    """The accuracy matrix (step × task) as an annotated heatmap."""
    import numpy as np

    K = len(matrix)
    grid = np.full((K, K), np.nan)
    for k, row in enumerate(matrix):
        grid[k, : len(row)] = row
    fig = new_figure(5, 4.2)
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
    return png_bytes(fig)
