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
# a multi-label row's macro mAP (metrics.json `map`): its columns join a table
# only when a row holds it, so single-label tables keep their bytes
MAP_GROUP = "map"
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


def _columns(report: dict[str, Any]) -> list[tuple[str | None, str, str]]:
    """(group or None for a scalar, key, header) of each table column: the
    scalars, the groups, and mAP's scalars when a row holds them. On
    multi-label rows (`measure: macro_f1`) the scalars are macro F1, so the
    first column reads F1."""
    f1 = _measure(report) is not None
    cols: list[tuple[str | None, str, str]] = [
        (None, k, "F1" if f1 and k == "acc" else COLUMNS[k]) for k in SCALARS
    ]
    for group, keys in GROUPS.items():
        cols += [(group, k, COLUMNS[k]) for k in keys]
    if any(MAP_GROUP in row for row in report["rows"].values()):
        cols += [
            (MAP_GROUP, k, "mAP" if k == "acc" else f"mAP {COLUMNS[k]}")
            for k in SCALARS
        ]
    return cols


def _measure(report: dict[str, Any]) -> tuple[str, float] | None:
    """(measure, threshold) of multi-label rows; None for accuracy."""
    row = next((r for r in report["rows"].values() if "measure" in r), None)
    return None if row is None else (row["measure"], row["threshold"])


def _stats(
    row: dict[str, Any], cols: list[tuple[str | None, str, str]]
) -> list[dict[str, Any] | None]:
    """The row's statistics in `cols` order (None where a group lacks one)."""
    return [row[k] if g is None else row.get(g, {}).get(k) for g, k, _ in cols]


def _cells(row: dict[str, Any], cols: list[tuple[str | None, str, str]]) -> list[str]:
    return [cell(stat) for stat in _stats(row, cols)]


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
    """The rows as a Markdown table, accuracies (or macro F1 and mAP) in %."""
    cols = _columns(report)
    header = ["", *(h for _, _, h in cols)]
    measure = _measure(report)
    what = (
        "Accuracy (%)"
        if measure is None
        else f"Macro F1 (%, scores > {measure[1]:g}) and macro mAP (%)"
    )
    lines = [
        f"{what} of each variant, {caption(report)}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for name, row in report["rows"].items():
        label = md_cell(report["labels"][name])
        lines.append(f"| {label} | " + " | ".join(_cells(row, cols)) + " |")
    return "\n".join(lines) + "\n"


def table_csv(report: dict[str, Any]) -> str:
    """One line per row: name, then mean and std of each column."""
    cols = _columns(report)
    names = [
        f"{k if g != MAP_GROUP else f'map_{k}'}_{s}"
        for g, k, _ in cols
        for s in ("mean", "std")
    ]
    lines = ["row," + ",".join(names)]
    for name, row in report["rows"].items():
        cells = []
        for stat in _stats(row, cols):
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
