"""The paper's results as figures (PNG): the per-step accuracy, the prompt
settings and stability/plasticity, from the same cells' metrics as their
tables (palpaper/render.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from palpaper.grids import Column, Result
from palpaper.render import row_name, stat_of
from solver.api import mean_std_line, new_figure, png_bytes


def figure(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any], title: str
) -> bytes | None:
    """The result's figure as PNG bytes (None for a table result)."""
    if not result.figure:
        return None
    draw = {"steps": _steps_figure, "prompt": _prompt_figure}.get(
        result.id, _stability_figure
    )
    fig = draw(result, columns, data)
    fig.suptitle(title, fontsize=7, wrap=True)
    fig.tight_layout()
    return png_bytes(fig)


def _steps_figure(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any]
) -> Any:
    """A panel per cell: accuracy over seen tasks per step, each row's
    mean ± std."""
    fig = new_figure(4 * len(columns), 3.8)
    axes = fig.subplots(1, len(columns), squeeze=False)[0]
    for ax, c in zip(axes, columns, strict=True):
        for row in result.rows:
            stats = (data[c.key].get(row) or {}).get("step_accuracy")
            if stats:
                mean_std_line(ax, stats, row_name(data, row, result.id))
        ax.set_title(c.label, fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylim(0, 102)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("accuracy over seen tasks (%)")
    axes[0].legend(fontsize=7)
    return fig


def _prompt_figure(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any]
) -> Any:
    """A panel per prompt setting (layers, length, pool size): PAL's Acc and
    FG with error bars over its values."""
    groups: dict[str, list[Column]] = {}
    for c in columns:
        groups.setdefault(c.key.split("-", 1)[0], []).append(c)
    fig = new_figure(4 * len(groups), 3.8)
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, (name, cols) in zip(axes, groups.items(), strict=True):
        x = list(range(len(cols)))
        for key, word in (("acc", "Acc"), ("fg", "FG")):
            stats = [stat_of(data[c.key], "pal", key) for c in cols]
            ax.errorbar(
                x,
                [s["mean"] for s in stats],
                yerr=[s["std"] or 0.0 for s in stats],
                marker="o",
                capsize=3,
                label=word,
            )
        ax.set_xticks(x, [c.label.split(" ")[-1] for c in cols])
        ax.set_xlabel({"pool": "pool size"}.get(name, name))
        ax.set_ylim(0, 102)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("PAL (%)")
    axes[0].legend(fontsize=7)
    return fig


def _stability_figure(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any]
) -> Any:
    """Bars per method: accuracy on the first task and on the later tasks."""
    (c,) = columns
    fig = new_figure(5, 3.8)
    ax = fig.add_subplot()
    width = 0.8 / len(result.rows)
    for i, row in enumerate(result.rows):
        stats = [stat_of(data[c.key], row, k) for k in ("first", "later")]
        ax.bar(
            [j + i * width for j in range(2)],
            [s["mean"] if s else 0.0 for s in stats],
            width,
            yerr=[(s["std"] or 0.0) if s else 0.0 for s in stats],
            capsize=3,
            label=row_name(data, row, result.id),
        )
    ax.set_xticks(
        [j + width * (len(result.rows) - 1) / 2 for j in range(2)],
        ["first task (stability)", "later tasks (plasticity)"],
    )
    ax.set_ylabel("accuracy after the last step (%)")
    ax.set_ylim(0, 102)
    ax.legend(fontsize=7)
    return fig
