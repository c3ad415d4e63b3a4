"""`pal-solver show`: a report's metrics.json as a table a terminal holds.

`dvc metrics show` prints the headline files (`headline/<row>.json`: Acc, FG,
AIA, Last); this prints any metrics.json as one line per row (variant):
its key, then Acc, FG, AIA, Last and the accuracy by missing type as
"mean ± std", in at most `--columns` columns (columns that do not fit are left
out, from the right, and named). A multi-label report (`measure` in its rows)
shows F1, FG, FG_diag (RebQ's forgetting), AIA, Last and mAP, then F1 by
missing type. The rows' labels follow the table; table.md beside the file
has every column.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from palcore.cliutil import clean_errors, params_option
from palcore.errors import PalError
from palcore.paramsfile import read_params_file
from solver.head_eval import HEADS_JSON
from solver.tables import COLUMNS, caption, cell

# (key in a row of metrics.json, its group or None, the column's header)
SHOWN = (
    ("acc", None),
    ("fg", None),
    ("aia", None),
    ("last", None),
    ("complete", "acc_by_missing"),
    ("image_missing", "acc_by_missing"),
    ("text_missing", "acc_by_missing"),
)
# a multi-label report's (macro F1 in acc's keys): RebQ's forgetting and mAP too
MULTI_SHOWN = (
    ("acc", None),
    ("fg", None),
    ("fg_diag", None),
    ("aia", None),
    ("last", None),
    ("acc", "map"),
    ("complete", "acc_by_missing"),
    ("image_missing", "acc_by_missing"),
    ("text_missing", "acc_by_missing"),
)
GAP = "  "


class ShowError(PalError):
    """A metrics file that is absent or not what `pal-solver report` writes."""


def _read(path: Path, rows: bool = True) -> dict[str, Any]:
    try:
        metrics = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        raise ShowError(f"{path}: no such metrics file") from None
    except ValueError as exc:
        raise ShowError(f"{path}: not JSON ({exc})") from None
    if not isinstance(metrics, dict) or "runs" not in metrics:
        raise ShowError(f"{path}: not a report's metrics.json (no 'runs')")
    runs = metrics["runs"]
    if not isinstance(runs, list) or not all(_whole(r) for r in runs):
        raise ShowError(f"{path}: 'runs' is {runs!r}, not a list of run numbers")
    for name, row in metrics.items():
        if rows and name not in ("runs", "vary"):
            _check_row(path, name, row)
    return metrics


def _head_rows(path: Path, head: str) -> dict[str, Any]:
    """The rows of one head from the heads.json beside a metrics.json, as
    metrics.json holds rows."""
    heads = _read(path.with_name(HEADS_JSON), rows=False)
    if head not in heads:
        have = ", ".join(k for k in heads if k not in ("runs", "vary")) or "none"
        raise ShowError(
            f"{path.with_name(HEADS_JSON)}: no head {head!r} (heads: {have}; "
            "add it to solve.heads and rerun solve and evaluate)"
        )
    for name, row in heads[head].items():
        _check_row(path.with_name(HEADS_JSON), name, row)
    return {"runs": heads["runs"], "vary": heads.get("vary", []), **heads[head]}


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_row(path: Path, name: str, row: Any) -> None:
    """A row of the report: its shown statistics each {"mean": x, "std": x
    or None}; anything else is a ShowError naming the key (never a row that
    silently leaves the table)."""
    if not isinstance(row, dict) or "acc" not in row:
        raise ShowError(f"{path}: '{name}' is not a report row (no 'acc')")
    for key, group in MULTI_SHOWN:  # SHOWN's and the multi-label columns
        holder = row.get(group) if group else row
        if holder is not None and not isinstance(holder, dict):
            raise ShowError(f"{path}: '{name}.{group}' is {holder!r}, not a mapping")
        stat = (holder or {}).get(key)
        where = f"{name}.{group}.{key}" if group else f"{name}.{key}"
        if stat is None:
            continue
        ok = isinstance(stat, dict) and _number(stat.get("mean"))
        if not ok or not (stat.get("std") is None or _number(stat.get("std"))):
            raise ShowError(
                f'{path}: \'{where}\' is {stat!r}, not {{"mean": x, "std": x}}'
            )


def _stat(row: dict[str, Any], key: str, group: str | None) -> dict | None:
    return (row.get(group) or {}).get(key) if group else row.get(key)


def table_lines(
    metrics: dict[str, Any], width: int = 120, order: Sequence[str] = ()
) -> list[str]:
    """The rows of a report's metrics as aligned text lines of ≤ `width`
    characters: a header, one line per row (those of `order` first, in its
    order: metrics.json sorts its keys), then each row's label."""
    rows = {k: v for k, v in metrics.items() if isinstance(v, dict) and "acc" in v}
    rows = {k: rows[k] for k in [*(o for o in order if o in rows), *sorted(rows)]}
    cols = [["", *rows]]
    for key, group, head in _columns(rows):
        cols.append([head, *(cell(_stat(r, key, group)) for r in rows.values())])
    sizes = [max(len(x) for x in col) for col in cols]
    kept = len(cols)
    while kept > 2 and sum(sizes[:kept]) + len(GAP) * (kept - 1) > width:
        kept -= 1
    lines = [
        GAP.join(
            col[i].ljust(size) if j == 0 else col[i].rjust(size)
            for j, (col, size) in enumerate(zip(cols, sizes[:kept], strict=False))
        ).rstrip()
        for i in range(len(rows) + 1)
    ]
    if kept < len(cols):
        left = ", ".join(col[0] for col in cols[kept:])
        lines.append(f"(not shown at {width} columns: {left})"[:width])
    for name, row in rows.items():
        lines.append(f"{name}: {row.get('label', name)}"[:width])
    return lines


def _columns(rows: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    """(key, group, header) of each column: SHOWN, or on multi-label rows
    (acc holds macro F1) MULTI_SHOWN."""
    if not any("measure" in r for r in rows.values()):
        return [(key, group, COLUMNS[key]) for key, group in SHOWN]
    heads = {("acc", None): "F1", ("acc", "map"): "mAP"}
    return [
        (key, group, heads.get((key, group), COLUMNS[key]))
        for key, group in MULTI_SHOWN
    ]


def _title(path: Path, metrics: dict[str, Any]) -> str:
    """What the table shows: accuracy, or (multi-label) F1 at its threshold
    and mAP; over which runs."""
    runs = {"runs": metrics["runs"], "vary": metrics.get("vary", [])}
    row = next(
        (r for r in metrics.values() if isinstance(r, dict) and "measure" in r),
        None,
    )
    measure = (
        "accuracy (%)"
        if row is None
        else f"macro F1 (%, scores > {row.get('threshold')}) and macro mAP (%)"
    )
    return f"{path}: {measure}, {caption(runs)}"


def _order(path: Path) -> list[str]:
    """The rows in table order, from the table.csv beside `path` (if any)."""
    table = path.with_name("table.csv")
    if not table.is_file():
        return []
    return [line.split(",", 1)[0] for line in table.read_text().splitlines()[1:]]


def _files(paths: Sequence[str], params_file: str) -> list[Path]:
    """metrics.json files: each path given (a file, or a report folder), or
    the params' report folder results/<data.dataset>/ and its subfolders'."""
    if not paths:
        dataset = (read_params_file(params_file).get("data") or {}).get("dataset")
        if not dataset:
            raise ShowError(f"{params_file}: no data.dataset to find the report by")
        folder = Path("results") / str(dataset)
        found = [folder / "metrics.json", *sorted(folder.glob("*/metrics.json"))]
        return [f for f in found if f.is_file()] or [folder / "metrics.json"]
    return [Path(p) / "metrics.json" if Path(p).is_dir() else Path(p) for p in paths]


@click.command("show")
@click.argument("paths", nargs=-1, metavar="[REPORT]...")
@click.option(
    "--columns",
    "width",
    default=120,
    show_default=True,
    metavar="N",
    help="Most columns a line takes.",
)
@click.option(
    "--head",
    default="ridge",
    show_default=True,
    metavar="NAME",
    help="The analytic head to show: ridge (the joint ridge of weights.h5, "
    "metrics.json) or one of solve.heads, read from heads.json beside it.",
)
@params_option
@clean_errors
def cli(paths: tuple[str, ...], width: int, head: str, params_file: str) -> None:
    """Print a report's metrics.json as a table of at most N columns.

    REPORT is a metrics.json or the folder that holds one (default: the
    params' results/<data.dataset>/ and each report folder in it, such as the
    ablation's). Each row: Acc, FG, AIA, Last and the accuracy by missing type,
    mean ± sample std over the runs, in %; on a multi-label report F1 in Acc's
    place, with FG_diag (RebQ's forgetting) and mAP.
    """
    for n, path in enumerate(_files(paths, params_file)):
        metrics = _read(path) if head == "ridge" else _head_rows(path, head)
        title = _title(path, metrics)
        if head != "ridge":
            title = f"{path.with_name(HEADS_JSON)}: head {head}, accuracy (%)"
        lines = [
            *textwrap.wrap(title, width),
            *table_lines(metrics, width, _order(path)),
        ]
        if head != "ridge":
            lines += textwrap.wrap(_state_line(head, metrics), width)
        click.echo(("\n" if n else "") + "\n".join(lines))


def _state_line(head: str, rows: dict[str, Any]) -> str:
    """The bytes of a head's own sums (every row's chain keeps the same)."""
    sizes = {
        row["state_bytes"]
        for name, row in rows.items()
        if name not in ("runs", "vary") and "state_bytes" in row
    }
    if not sizes:
        return f"{head}'s own state: not recorded (an older heads.json)"
    size = ", ".join(_size(b) for b in sorted(sizes))
    return (
        f"{head}'s own state: {size} per chain, beside the G, Q and class "
        "counts every head shares"
    )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
