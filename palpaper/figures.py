"""The paper's results as figures (a 300-dpi PNG and a PDF each): the
per-step accuracy, the prompt settings and stability/plasticity, from the
same cells' metrics as their tables (palpaper/render.py), in the solver's
style (solver/plots.py: a style per method, PAL on top, legends outside the
data, a paper's page wide). The caption is the result's .md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from palpaper.grids import Column, Result
from palpaper.render import row_name, stat_of
from solver.api import (
    PAGE_IN,
    PAPER_METHOD,
    accuracy_axes,
    figure_files,
    legend_below,
    mean_std_line,
    new_figure,
    paper_style,
    style_of,
)

# the prompt figure's two metrics of PAL: key, name, dash, marker
METRIC_LINES = (("acc", "Acc", "-", "o"), ("fg", "FG", "--", "s"))
# what each figure plots, its title (the caption has the details)
TITLES = {
    "steps": "Accuracy after each step",
    "prompt": "PAL against its prompt settings",
    "stability": "Stability and plasticity after the last step",
}


def figure(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any]
) -> dict[str, bytes]:
    """The result's figure as {name: bytes} (`<id>.png`, `<id>.pdf`); empty
    for a table result."""
    if not result.figure:
        return {}
    draw = {"steps": _steps_figure, "prompt": _prompt_figure}.get(
        result.id, _stability_figure
    )
    with paper_style():
        fig = draw(result, columns, data)
        fig.suptitle(TITLES.get(result.id, result.title))
        return figure_files(fig, result.id)


def _steps_figure(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any]
) -> Any:
    """A panel per cell: accuracy over seen tasks per step, each row's
    mean ± std; one legend under the panels."""
    fig = new_figure(PAGE_IN, 3.3)
    axes = fig.subplots(1, len(columns), squeeze=False, sharey=True)[0]
    for ax, c in zip(axes, columns, strict=True):
        steps: list[int] = []
        for row in result.rows:
            stats = (data[c.key].get(row) or {}).get("step_accuracy")
            if stats:
                label = row_name(data, row, result.id)
                steps = mean_std_line(ax, stats, label, row)
        accuracy_axes(ax, steps)
        ax.set_title(c.label)
        if ax is not axes[0]:
            ax.set_ylabel("")
    legend_below(fig, axes[0], columns=3)
    return fig


def _prompt_figure(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any]
) -> Any:
    """A panel per prompt setting (layers, length, pool size): PAL's Acc and
    FG with error bars over its values (Acc in PAL's style, FG dashed)."""
    groups: dict[str, list[Column]] = {}
    for c in columns:
        groups.setdefault(c.key.split("-", 1)[0], []).append(c)
    fig = new_figure(PAGE_IN, 2.7)
    axes = fig.subplots(1, len(groups), squeeze=False, sharey=True)[0]
    pal = style_of(PAPER_METHOD)
    for ax, (name, cols) in zip(axes, groups.items(), strict=True):
        x = list(range(len(cols)))
        for key, word, dash, marker in METRIC_LINES:
            stats = [stat_of(data[c.key], PAPER_METHOD, key) or {} for c in cols]
            ax.errorbar(
                x,
                [s.get("mean") or 0.0 for s in stats],
                yerr=[s.get("std") or 0.0 for s in stats],
                color=pal.color,
                linestyle=dash,
                marker=marker,
                linewidth=1.6 if key == "acc" else 1.2,
                capsize=3,
                label=f"PAL's {word}",
            )
        ax.set_xticks(x, [c.label.split(" ")[-1] for c in cols])
        ax.set_xlabel({"pool": "pool size"}.get(name, name))
        ax.set_ylim(0, 102)
    axes[0].set_ylabel("PAL's Acc and FG (%)")
    legend_below(fig, axes[0], columns=2)
    return fig


def _stability_figure(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any]
) -> Any:
    """Bars per method, in its colour and hatched apart: accuracy on the
    first task and on the later tasks."""
    (c,) = columns
    fig = new_figure(PAGE_IN / 2, 2.9)
    ax = fig.add_subplot()
    width = 0.8 / len(result.rows)
    hatches = ("", "//", "..", "xx", "\\\\", "++")
    for i, row in enumerate(result.rows):
        stats = [stat_of(data[c.key], row, k) for k in ("first", "later")]
        s = style_of(row)
        ax.bar(
            [j + i * width for j in range(2)],
            [st["mean"] if st else 0.0 for st in stats],
            width,
            yerr=[(st["std"] or 0.0) if st else 0.0 for st in stats],
            capsize=3,
            color=s.color,
            edgecolor="black",
            linewidth=0.5,
            hatch=hatches[i % len(hatches)],
            zorder=s.z,
            label=row_name(data, row, result.id),
        )
    ax.set_xticks(
        [j + width * (len(result.rows) - 1) / 2 for j in range(2)],
        ["first task (stability)", "later tasks (plasticity)"],
    )
    ax.set_ylabel("accuracy after the last step (%)")
    ax.set_ylim(0, 102)
    ax.grid(axis="x", visible=False)
    legend_below(fig, ax, columns=2)
    return fig
