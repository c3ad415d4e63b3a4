"""The paper's results in the paper's layout: Markdown, CSV and PNG.

Each result becomes one table: label columns, then value columns in the
paper's order. A measured value is "mean ± std" over the cell's runs (the
sample std; one run has none), followed by the paper's value in parentheses
where the paper reports one for this dataset (`published.yaml`). The CSV
holds the same lines with each value as its mean, std and paper number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from palpaper.grids import Column, Result
from palpaper.packaged import published
from solver.api import mean_std_line, new_figure, png_bytes

DATASETS = {"food101": "UPMC-Food101", "n24news": "N24News"}
Stat = Mapping[str, Any]  # {"mean": float, "std": float | None, ...}
Value = tuple[Stat | None, float | None]  # measured, published


def _row_entry(data: Mapping[str, Any], row: str) -> Mapping[str, Any]:
    """The row `row` of the first cell whose metrics.json labels it."""
    for metrics in data.values():
        entry = (metrics or {}).get(row)
        if isinstance(entry, Mapping) and "label" in entry:
            return entry
    return {}


def paper_name(data: Mapping[str, Any], row: str, rid: str) -> str | None:
    """The paper's name of `row` in result `rid` (params `ablation.<v>.paper`,
    as the report wrote it into metrics.json); None where the paper has none."""
    paper = _row_entry(data, row).get("paper")
    return paper.get(rid) if isinstance(paper, Mapping) else paper


def row_name(data: Mapping[str, Any], row: str, rid: str) -> str:
    """How `row` is shown in result `rid`: the paper's name, else its label
    (both from the cells' metrics.json), else its key."""
    return paper_name(data, row, rid) or _row_entry(data, row).get("label") or row


@dataclass
class Table:
    """A rendered result: its caption, headers and lines."""

    caption: str
    labels: list[str]  # the label columns' headers
    values: list[str]  # the value columns' headers
    lines: list[tuple[list[str], list[Value]]]
    protocol: str = ""  # how the run departs from the paper's, for the CSV

    def markdown(self) -> str:
        header = [*self.labels, *self.values]
        out = [
            self.caption,
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for labels, values in self.lines:
            cells = [*labels, *(cell(s, p) for s, p in values)]
            out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out) + "\n"

    def csv(self) -> str:
        def name(h: str) -> str:
            return h.replace(",", ";")

        cols = [name(h) for h in self.labels]
        cols += [
            f"{name(h)} {part}"
            for h in self.values
            for part in ("mean", "std", "paper")
        ]
        if self.protocol:
            cols.append("departs from the paper's protocol")
        out = [",".join(_quote(c) for c in cols)]
        for labels, values in self.lines:
            row = [_quote(x) for x in labels]
            for stat, paper in values:
                mean = None if stat is None else stat["mean"]
                std = None if stat is None else stat["std"]
                row += [_num(mean), _num(std), _num(paper)]
            if self.protocol:
                row.append(_quote(self.protocol))
            out.append(",".join(row))
        return "\n".join(out) + "\n"


def _quote(text: str) -> str:
    return f'"{text}"' if "," in text or '"' in text else text


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.4f}"


def cell(stat: Stat | None, paper: float | None) -> str:
    """'mean ± std (paper)'; one run: 'mean'; no measurement: '–'."""
    if stat is None or stat.get("mean") is None:
        text = "–"
    elif stat.get("std") is None:
        text = f"{stat['mean']:.2f}"
    else:
        text = f"{stat['mean']:.2f} ± {stat['std']:.2f}"
    return text if paper is None else f"{text} ({paper:.2f})"


def _runs_words(runs: Sequence[int]) -> str:
    ids = ", ".join(str(r) for r in runs)
    if len(runs) == 1:
        return f"one run per cell (run {ids}), no spread"
    return f"mean ± sample std over {len(runs)} runs per cell ({ids})"


def caption(
    result: Result,
    dataset: str,
    runs: Sequence[int],
    compared: bool,
    rerun: str,
    departs: str = "",
    missing: int = 0,
) -> str:
    """What the table is, where its numbers come from, what it cannot show;
    `departs`: the sentence on how the run departs from the paper's
    protocol; `missing`: cells without a finished experiment (marked –)."""
    where = DATASETS.get(dataset, f"the {dataset} dataset")
    text = f"{result.paper} of the paper: {result.title}; {where}, {_runs_words(runs)}."
    if missing:
        text += (
            f" Partial: {missing} cell{'s' * (missing != 1)} not run yet (marked –)."
        )
    if compared:
        text += f" In parentheses: the paper's {DATASETS[dataset]} numbers.{departs}"
    elif dataset not in DATASETS:
        text += (
            f" The paper reports no numbers for {dataset}: there is nothing to "
            "compare, and the cells show what this pipeline does at its scale."
        )
    else:
        text += f" The paper gives no {DATASETS[dataset]} numbers for this result."
    return f"{text} Made by `{rerun}`."


def _stat(metrics: Mapping[str, Any], row: str, key: str) -> Stat | None:
    entry = metrics.get(row)
    if entry is None:
        return None
    if key in ("first", "later"):
        return entry.get("acc_by_task", {}).get(key)
    return entry.get(key)


def build(
    result: Result,
    columns: Sequence[Column],
    data: Mapping[str, Mapping[str, Any]],
    dataset: str,
    rerun: str,
    departs: Sequence[str] = (),
) -> Table:
    """The result's table from each column's metrics (`data[column.key]`; {}
    for a cell not run yet, marked –); `departs`: how the run departs from
    the paper's protocol (`departures.departures`), said where the paper's
    numbers stand beside it."""
    from palpaper.departures import sentence

    pub = published().get(result.id, {}).get(dataset)
    runs = next((d["runs"] for d in data.values() if d), [])
    table = _BUILDERS[result.id](result, columns, data, pub)
    missing = sum(1 for c in columns if not data[c.key])
    table.caption = caption(
        result, dataset, runs, pub is not None, rerun, sentence(departs), missing
    )
    if pub is not None and departs:
        table.protocol = "; ".join(departs)
    return table


def _metric_block(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any], pub: Any
) -> Table:
    """Tables 1-2: a block of rows per metric, a column per scenario."""
    lines = []
    for metric, word in (("acc", "Acc"), ("fg", "FG")):
        for row in result.rows:
            name = paper_name(data, row, result.id) or ""
            paper = (pub or {}).get(metric, {}).get(name)
            values = [
                (_stat(data[c.key], row, metric), None if paper is None else paper[i])
                for i, c in enumerate(columns)
            ]
            lines.append(([word, row_name(data, row, result.id)], values))
    return Table("", ["Metric", "Method"], [c.label for c in columns], lines)


def _steps(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any], pub: Any
) -> Table:
    """The step figures' numbers: a line per (rate, method), a column per step."""
    n = max(
        len((data[c.key].get("pal") or {}).get("step_accuracy", [])) for c in columns
    )
    lines = []
    for c in columns:
        for row in result.rows:
            steps = (data[c.key].get(row) or {}).get("step_accuracy", [])
            values = [(steps[k] if k < len(steps) else None, None) for k in range(n)]
            lines.append(([c.label, row_name(data, row, result.id)], values))
    return Table("", ["Scenario", "Method"], [f"step {k + 1}" for k in range(n)], lines)


def _rows_of_one_cell(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any], pub: Any
) -> Table:
    """Table 3 and the stability figure: one cell, a line per method."""
    (col,) = columns
    keys = ("first", "later") if result.id == "stability" else ("acc", "fg")
    heads = (
        ["first task (stability)", "later tasks (plasticity)"]
        if result.id == "stability"
        else ["Acc", "FG"]
    )
    lines = []
    for row in result.rows:
        paper = (pub or {}).get(paper_name(data, row, result.id) or "", {})
        values = [(_stat(data[col.key], row, k), paper.get(k)) for k in keys]
        lines.append(([row_name(data, row, result.id)], values))
    return Table("", ["Method"], heads, lines)


def _swept(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any], pub: Any
) -> Table:
    """Tables 4-5 and the prompt figures: a line per cell, Acc and FG."""
    pub = list(pub or [])
    lines = []
    for c in columns:
        paper = _published_line(result, c, pub)
        values = [(_stat(data[c.key], "pal", k), paper.get(k)) for k in ("acc", "fg")]
        lines.append(([c.label], values))
    label = {"upsampling": "Width and η", "tasks": "Steps", "prompt": "Prompt"}[
        result.id
    ]
    return Table("", [label], ["Acc", "FG"], lines)


def _published_line(result: Result, column: Column, pub: list[dict]) -> dict:
    """The paper's line of a swept column: same width and η, or same K."""
    for entry in pub:
        if result.id == "upsampling" and column.key == _size_key(entry):
            return entry
        if result.id == "tasks" and column.key == f"K-{entry['tasks']}":
            return entry
    return {}


def _size_key(entry: Mapping[str, Any]) -> str:
    return f"{entry['width'] // 1000}k-{entry['eta']:g}"


_BUILDERS = {
    "missing": _metric_block,
    "steps": _steps,
    "ablation": _rows_of_one_cell,
    "stability": _rows_of_one_cell,
    "prompt": _swept,
    "upsampling": _swept,
    "tasks": _swept,
}


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
            stats = [_stat(data[c.key], "pal", key) for c in cols]
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
        stats = [_stat(data[c.key], row, k) for k in ("first", "later")]
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
