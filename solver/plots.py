"""The plots' plumbing, one home for the report, `evaluate` and `pal-paper`:
an off-screen figure, its PNG bytes, and a series drawn as mean ± std.

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
