"""The report's tables as text: Markdown, CSV, and the steps' CSVs.

`report` is what `solver.report.build` returns: runs, vary, rows (name ->
statistics), labels (name -> label). Same report, same bytes.
"""

from __future__ import annotations

import csv
import io
from typing import Any

GROUPS = {  # the per-run dicts of metrics.json that a row aggregates key by key
    "acc_by_missing": ("complete", "image_missing", "text_missing"),
    "acc_by_task": ("first", "later"),
}
SCALARS = ("acc", "fg", "fg_diag", "aia", "last")
COLUMNS = {
    "acc": "Acc",
    "fg": "FG",
    "fg_diag": "FG_diag",
    "aia": "AIA",
    "last": "Last",
    "complete": "complete",
    "image_missing": "image missing",
    "text_missing": "text missing",
    "first": "first task",
    "later": "later tasks",
}
SEED_WORDS = {
    "class_order": "class order",
    "missing": "missing tables",
    "prompts": "prompt init and batch order",
    "upsampling": "up-sampling",
}


def cell(stat: dict[str, Any] | None) -> str:
    if stat is None:
        return ""
    if stat["std"] is None:
        return f"{stat['mean']:.2f}"
    return f"{stat['mean']:.2f} ± {stat['std']:.2f}"


def _stats(row: dict[str, Any]) -> list[dict[str, Any] | None]:
    """The row's statistics in COLUMNS order (None where a group lacks one)."""
    stats = [row[k] for k in SCALARS]
    for group, keys in GROUPS.items():
        stats += [row.get(group, {}).get(k) for k in keys]
    return stats


def _cells(row: dict[str, Any]) -> list[str]:
    return [cell(stat) for stat in _stats(row)]


def caption(report: dict[str, Any]) -> str:
    """Which runs the table averages and which seeds differ between them."""
    runs = ", ".join(str(r) for r in report["runs"])
    n = len(report["runs"])
    varied = [SEED_WORDS[v] for v in report["vary"]]
    seeds = (
        f"run r adds r to the seeds of: {', '.join(varied)}"
        if varied
        else "no seed differs between runs"
    )
    if n == 1:
        return f"one run ({runs}), no spread; {seeds}."
    return f"mean ± sample std over {n} runs ({runs}); {seeds}."


def md_cell(text: str) -> str:
    """`text` as one Markdown table cell: `|` escaped, line breaks as spaces
    (a label may hold either; the CSVs keep it as written)."""
    return " ".join(str(text).replace("|", "\\|").split())


def table_md(report: dict[str, Any]) -> str:
    """The rows as a Markdown table, accuracies in %."""
    header = ["", *COLUMNS.values()]
    lines = [
        f"Accuracy (%) of each variant, {caption(report)}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, row in report["rows"].items():
        label = md_cell(report["labels"][name])
        lines.append(f"| {label} | " + " | ".join(_cells(row)) + " |")
    return "\n".join(lines) + "\n"


def table_csv(report: dict[str, Any]) -> str:
    """One line per row: name, then mean and std of each column."""
    cols = [f"{k}_{s}" for k in COLUMNS for s in ("mean", "std")]
    lines = ["row," + ",".join(cols)]
    for name, row in report["rows"].items():
        cells = []
        for stat in _stats(row):
            for s in ("mean", "std"):
                value = None if stat is None else stat[s]
                cells.append("" if value is None else f"{value:.4f}")
        lines.append(f"{name}," + ",".join(cells))
    return "\n".join(lines) + "\n"


def steps_csv(report: dict[str, Any]) -> str:
    """step, then <row>_mean and <row>_std for each row."""
    rows = report["rows"]
    names = list(rows)
    lines = ["step," + ",".join(f"{n}_{s}" for n in names for s in ("mean", "std"))]
    n_steps = len(next(iter(rows.values()))["step_accuracy"])
    for k in range(n_steps):
        cells = []
        for n in names:
            stat = rows[n]["step_accuracy"][k]
            cells.append(f"{stat['mean']:.4f}")
            cells.append("" if stat["std"] is None else f"{stat['std']:.4f}")
        lines.append(f"{k + 1}," + ",".join(cells))
    return "\n".join(lines) + "\n"


def steps_rows_csv(report: dict[str, Any]) -> str:
    """The steps' accuracy one line per (row, step): step, row, label, mean,
    std. Its columns do not depend on the rows, so `dvc plots show` draws
    every row of the report, labelled as the report labels it (dvc.yaml
    `plots:`, template `.dvc/plots/rows.json`)."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["step", "row", "label", "mean", "std"])
    for name, row in report["rows"].items():
        for k, stat in enumerate(row["step_accuracy"], start=1):
            std = "" if stat["std"] is None else f"{stat['std']:.4f}"
            out.writerow([k, name, report["labels"][name], f"{stat['mean']:.4f}", std])
    return buf.getvalue()
