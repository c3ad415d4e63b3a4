"""The solver's plots, and their plumbing that `pal-paper` draws with too: one
style per method in every figure, sizes of a paper's column, the legend
outside the data, and each figure as a 300-dpi PNG and a PDF whose bytes hold
no date (same data, same bytes).

The style: Okabe and Ito's colour-blind-safe palette, and a dash and a marker
of its own for each method, so that curves part in grey too; the paper's
method (PAL) is drawn on top, thicker. A title says what is plotted; the
methods' details and the runs are in the caption (table.md's first line, a
result's .md).

matplotlib is imported inside each function: the solver runs without it
(its callers catch ImportError and skip the plot, with a warning).
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

COLUMN_IN = 3.5  # a paper's column, inches
PAGE_IN = 7.0  # both columns
DPI = 300

# Okabe & Ito (2008), "Color Universal Design"
BLACK, ORANGE, SKY, GREEN = "#000000", "#E69F00", "#56B4E9", "#009E73"
YELLOW, BLUE, VERMILLION, PURPLE = "#F0E442", "#0072B2", "#D55E00", "#CC79A7"
GREY = "#7F7F7F"

RC = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "legend.fontsize": 7,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "pdf.fonttype": 42,  # TrueType: the text stays text in the PDF
}


@dataclass(frozen=True)
class Style:
    """How a method is drawn in every figure."""

    color: str
    dash: str
    marker: str
    width: float = 1.2
    z: int = 2  # drawing order: higher on top


PAPER_METHOD = "pal"
STYLES = {
    PAPER_METHOD: Style(VERMILLION, "-", "o", 2.4, 10),
    "bp": Style(PURPLE, "--", "s", 1.4, 4),  # PAL's BP head
    "frozen": Style(BLUE, "-.", "^", 1.4, 4),  # ACIL
    "init": Style(BLACK, ":", "v", 1.4, 3),
    "map": Style(ORANGE, "--", "D"),
    "map_own": Style(ORANGE, ":", "d"),
    "msp": Style(SKY, "-.", "P"),
    "l2p": Style(GREEN, ":", "X"),
    "l2p_own": Style(GREEN, "--", "x"),
    "l2p_pp": Style(GREEN, "-.", "+"),
    "dualprompt": Style(GREY, "--", "*"),
    "rebq": Style(BLACK, "-", "h"),
    "no_recon": Style(SKY, "--", "<"),
    "shared": Style(ORANGE, "-", ">"),
    "vector": Style(GREEN, "-", "p"),
    "input": Style(GREY, "-", "8"),
    "fast": Style(PURPLE, ":", "H"),
    "first": Style(BLUE, ":", "1"),
}
_OTHERS = [
    Style(c, d, m)
    for c, d, m in zip(
        (BLUE, ORANGE, SKY, GREEN, PURPLE, GREY, BLACK),
        ("--", ":", "-.", "--", ":", "-.", "--"),
        ("2", "3", "4", "|", "_", "$a$", "$b$"),
        strict=True,
    )
]


def style_of(key: str) -> Style:
    """A method's style by its row key (a variant's name, `bp` for PAL's BP
    head); a key not listed gets one by its name, the same everywhere."""
    if key in STYLES:
        return STYLES[key]
    index = int(hashlib.sha256(key.encode()).hexdigest(), 16) % len(_OTHERS)
    return _OTHERS[index]


@contextmanager
def paper_style() -> Iterator[None]:
    """The figures' font sizes and grid while a figure is drawn and saved."""
    import matplotlib

    # rc_context's stubs list every key as a literal; RC's keys are among them
    with matplotlib.rc_context(cast("dict[Any, Any]", RC)):
        yield


def new_figure(width: float, height: float) -> Any:
    """A matplotlib Figure of width x height inches, laid out by matplotlib
    (legends outside the axes fit), drawn by Agg (no display, no pyplot
    state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Any) -> bytes:
    """The figure as 300-dpi PNG bytes, without matplotlib's version stamp,
    so the same figure gives the same bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def pdf_bytes(fig: Any) -> bytes:
    """The figure as PDF bytes, without a date or a producer: the same figure
    gives the same bytes. fontTools, which subsets the embedded font, logs
    each step at INFO: kept to warnings, so a stage's log stays its own."""
    buf = io.BytesIO()
    meta = {"CreationDate": None, "Producer": None, "Creator": None}
    fonts = logging.getLogger("fontTools")
    level = fonts.level
    fonts.setLevel(logging.WARNING)
    try:
        fig.savefig(buf, format="pdf", metadata=meta)
    finally:
        fonts.setLevel(level)
    return buf.getvalue()


def figure_files(fig: Any, stem: str) -> dict[str, bytes]:
    """`stem`.png (300 dpi) and `stem`.pdf (vector) of the figure."""
    return {f"{stem}.png": png_bytes(fig), f"{stem}.pdf": pdf_bytes(fig)}


def styled_line(
    ax: Any, x: Sequence[float], y: Sequence[float], key: str, label: str
) -> Any:
    """A method's line in its style."""
    s = style_of(key)
    big = s.width > 2
    (line,) = ax.plot(
        x,
        y,
        color=s.color,
        linestyle=s.dash,
        marker=s.marker,
        linewidth=s.width,
        markersize=5 if big else 4,
        zorder=s.z,
        label=label,
    )
    return line


def mean_std_line(
    ax: Any, stats: Sequence[Mapping[str, float | None]], label: str, key: str = ""
) -> list[int]:
    """Plot `stats` (one {"mean", "std"} per step) against steps 1..n in the
    style of method `key`; shade mean ± std in its colour when every step has
    a std (a single run has none). Returns the steps."""
    steps = list(range(1, len(stats) + 1))
    mean = [float(s["mean"] or 0.0) for s in stats]
    line = styled_line(ax, steps, mean, key or label, label)
    if all(s["std"] is not None for s in stats):
        lo = [float(s["mean"] or 0.0) - float(s["std"] or 0.0) for s in stats]
        hi = [float(s["mean"] or 0.0) + float(s["std"] or 0.0) for s in stats]
        z = line.get_zorder() - 1
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.08, zorder=z)
    return steps


def legend_below(fig: Any, ax: Any, columns: int = 2) -> None:
    """The figure's legend under its axes, out of the data, the paper's
    method first."""
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(handles)), key=lambda i: -_zorder(handles[i]))
    fig.legend(
        [handles[i] for i in order],
        [labels[i] for i in order],
        loc="outside lower center",
        ncol=columns,
        frameon=False,
    )


def _zorder(handle: Any) -> float:
    """A legend handle's drawing order (a container's: its first artist's)."""
    if hasattr(handle, "get_zorder"):
        return float(handle.get_zorder())
    return float(handle[0].get_zorder()) if len(handle) else 0.0


def accuracy_axes(ax: Any, steps: Sequence[int]) -> None:
    """The per-step axes: steps on x, accuracy over seen tasks on y."""
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy over seen tasks (%)")
    ax.set_xticks(list(steps))
    ax.set_ylim(0, 102)  # room for markers at 100 %


def step_plot_png(al: list[float], bp: list[float] | None, title: str) -> bytes:
    """One chain's accuracy per step (AL vs BP), as PNG bytes."""
    with paper_style():
        fig = new_figure(COLUMN_IN, 3.0)
        ax = fig.add_subplot()
        steps = list(range(1, len(al) + 1))
        styled_line(ax, steps, al, PAPER_METHOD, "AL (analytic)")
        if bp is not None:
            styled_line(ax, steps, bp, "bp", "BP head")
        accuracy_axes(ax, steps)
        ax.set_title(title)
        legend_below(fig, ax)
        return png_bytes(fig)


def steps_figure(report: dict[str, Any]) -> dict[str, bytes]:
    """Mean accuracy over seen tasks per step, each row shaded mean ± std:
    step_accuracy.png and .pdf."""
    with paper_style():
        rows = report["rows"]
        fig = new_figure(COLUMN_IN, 2.4 + 0.16 * len(rows))  # the legend below
        ax = fig.add_subplot()
        steps: list[int] = []
        for name, row in rows.items():
            label = report["labels"][name]
            steps = mean_std_line(ax, row["step_accuracy"], label, name)
        accuracy_axes(ax, steps)
        ax.set_title("Accuracy after each step")
        legend_below(fig, ax, columns=1)
        return figure_files(fig, "step_accuracy")


def matrix_figure(matrix: list[list[float]], title: str) -> dict[str, bytes]:
    """The accuracy matrix (step × task) as an annotated heatmap:
    accuracy_matrix.png and .pdf."""
    import numpy as np

    with paper_style():
        K = len(matrix)
        grid = np.full((K, K), np.nan)
        for k, row in enumerate(matrix):
            grid[k, : len(row)] = row
        fig = new_figure(COLUMN_IN, 3.0)
        ax = fig.add_subplot()
        ax.grid(False)
        image = ax.imshow(grid, vmin=0, vmax=100, cmap="viridis")
        for k, row in enumerate(matrix):
            for i, a in enumerate(row):
                color = "k" if a > 60 else "w"  # readable on viridis' yellow
                ax.text(i, k, f"{a:.0f}", ha="center", va="center", color=color)
        ax.set_xticks(range(K), [str(i) for i in range(1, K + 1)])
        ax.set_yticks(range(K), [str(k) for k in range(1, K + 1)])
        ax.set_xlabel("task")
        ax.set_ylabel("after step")
        ax.set_title(title)
        fig.colorbar(image, ax=ax, label="accuracy (%)")
        return figure_files(fig, "accuracy_matrix")
