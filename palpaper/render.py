"""The paper's results in the paper's layout: Markdown and CSV (their
figures: palpaper/figures.py).

Each result becomes one table: label columns, then value columns in the
paper's order. A measured value is "mean ± std" over the cell's runs (the
sample std; one run has none), followed by the paper's value in parentheses
where the paper reports one for this dataset (`published.yaml`). With
`--baselines cited`, Tables 1-2's five compared methods are the paper's
numbers alone, each marked "(cited)". A superscript on a paper's number (or
after an FG line's method) refers to a note under the table
(palpaper/notes.py). The CSV holds the same lines with each value as its
mean, std and paper number; a `source` column (measured, or cited from the
paper) where some lines are cited, and a `paper notes` column with each
line's notes ("[n] <columns>: text") where the table has notes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from palpaper.grids import CITED, Column, Result
from palpaper.notes import footnotes, listed
from palpaper.packaged import published
from palpaper.table import Stat, Table, Value

DATASETS = {"food101": "UPMC-Food101", "n24news": "N24News", "mmimdb": "MM-IMDb"}
HEADS_KEY = "heads.json"  # a cell's heads.json, kept beside its metrics' rows


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
    cited: str = "",
    measure: str = "",
) -> str:
    """What the table is, where its numbers come from, what it cannot show;
    `departs`: the sentence on how the run departs from the paper's
    protocol; `missing`: cells without a finished experiment (marked –);
    `cited`: the sentence on the baselines `--baselines cited` did not run;
    `measure`: the sentence on what a multi-label dataset's rows hold."""
    where = DATASETS.get(dataset, f"the {dataset} dataset")
    source = (
        "Beyond the paper" if result.id == "heads" else f"{result.paper} of the paper"
    )
    text = f"{source}: {result.title}; {where}, {_runs_words(runs)}.{measure}"
    if missing:
        text += (
            f" Partial: {missing} cell{'s' * (missing != 1)} not run yet (marked –)."
        )
    if compared:
        whose = (published().get("sources") or {}).get(dataset, "the paper's")
        text += f" In parentheses: {whose} {DATASETS[dataset]} numbers."
        text += cited + departs
        cited = ""
    elif dataset not in DATASETS:
        text += (
            f" The paper reports no numbers for {dataset}: there is nothing to "
            "compare, and the cells show what this pipeline does at its scale."
        )
    else:
        text += f" The paper gives no {DATASETS[dataset]} numbers for this result."
    return f"{text}{cited} Made by `{rerun}`."


def stat_of(metrics: Mapping[str, Any], row: str, key: str) -> Stat | None:
    entry = metrics.get(row)
    if entry is None:
        return None
    if key in ("first", "later"):
        return entry.get("acc_by_task", {}).get(key)
    if key == "map":  # a multi-label row's macro mAP (its avg over tasks)
        return (entry.get("map") or {}).get("acc")
    return entry.get(key)


# Tables 1-2's metrics: accuracy and FG; on multi-label rows (`measure:
# macro_f1`) RebQ's: macro F1, its forgetting (fg_diag) and macro mAP
ACC_METRICS = (("acc", "Acc"), ("fg", "FG"))
F1_METRICS = (("acc", "F1"), ("fg_diag", "FG"), ("map", "mAP"))


def block_metrics(data: Mapping[str, Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    """The (key, word) of each metric block: F1_METRICS when any cell's row
    was scored by macro F1, else ACC_METRICS."""
    multi = any(
        isinstance(entry, Mapping) and "measure" in entry
        for cell in data.values()
        for entry in cell.values()
    )
    return F1_METRICS if multi else ACC_METRICS


def build(
    result: Result,
    columns: Sequence[Column],
    data: Mapping[str, Mapping[str, Any]],
    dataset: str,
    rerun: str,
    departs: Sequence[str] = (),
    cited: Mapping[str, str] | None = None,
) -> Table:
    """The result's table from each column's metrics (`data[column.key]`; {}
    for a cell not run yet, marked –); `departs`: how the run departs from
    the paper's protocol (`departures.departures`), said where the paper's
    numbers stand beside it; `cited`: row -> the paper's name of the rows
    `--baselines cited` did not run: the paper's numbers alone where the
    result cites (Tables 1-2), else left out of `result.rows` already."""
    from palpaper.departures import sentence

    pub = published().get(result.id, {}).get(dataset)
    runs: list[int] = next((d["runs"] for d in data.values() if d), [])
    if cited and result.cites:
        table = _metric_block(result, columns, data, pub, cited)
    else:
        table = _BUILDERS[result.id](result, columns, data, pub)
    if pub is not None:
        table.notes = footnotes(
            result.id,
            dataset,
            [c.key for c in columns],
            [(la[0], la[-1], [p is not None for _, p in v]) for la, v in table.lines],
        )
    missing = sum(1 for c in columns if not data[c.key])
    said = sentence(departs)
    if table.notes is not None:
        said += " A superscript refers to a note on the paper's numbers below."
    table.caption = caption(
        result,
        dataset,
        runs,
        pub is not None,
        rerun,
        said,
        missing,
        _cited_sentence(cited or {}, result.cites),
        _measure_sentence(data),
    )
    if pub is not None and departs:
        table.protocol = "; ".join(departs)
    return table


def _measure_sentence(data: Mapping[str, Mapping[str, Any]]) -> str:
    """On multi-label rows (`measure: macro_f1`): what F1, FG and mAP are."""
    entry = next(
        (
            e
            for cell in data.values()
            for e in cell.values()
            if isinstance(e, Mapping) and "measure" in e
        ),
        None,
    )
    if entry is None:
        return ""
    return (
        " Multi-label, scored as RebQ scores MM-IMDb: F1 is the macro F1 of the "
        f"labels whose score exceeds {entry['threshold']:g} (the ridge's raw "
        "score; a BP head's logit through a sigmoid), FG RebQ's forgetting "
        "(fg_diag: a task's F1 right after it was learnt minus its final F1), "
        "mAP the macro mean average precision."
    )


def _cited_sentence(cited: Mapping[str, str], cites: bool) -> str:
    """What the caption says of the methods `--baselines cited` did not run."""
    names = listed([n for n in CITED if n in cited.values()])
    if not names:
        return ""
    if cites:
        return (
            f" {names} are not run here (`--baselines cited`): their rows are "
            "the paper's numbers, each marked (cited)."
        )
    return (
        f" {names} are not run here (`--baselines cited`), and the paper gives "
        "no numbers of theirs for this result: they are left out."
    )


def _metric_block(
    result: Result,
    columns: Sequence[Column],
    data: Mapping[str, Any],
    pub: Any,
    cited: Mapping[str, str] | None = None,
) -> Table:
    """Tables 1-2: a block of rows per metric, a column per scenario; the
    rows of `cited` (row -> the paper's name) give the paper's numbers alone,
    whatever a cell's metrics hold for them."""
    cited = cited or {}
    table = Table("", ["Metric", "Method"], [c.label for c in columns], [])
    for metric, word in block_metrics(data):
        for row in result.rows:
            name = cited.get(row) or paper_name(data, row, result.id) or ""
            paper = (pub or {}).get(metric, {}).get(name)
            values = [
                (
                    None if row in cited else stat_of(data[c.key], row, metric),
                    None if paper is None else paper[i],
                )
                for i, c in enumerate(columns)
            ]
            if row in cited:
                table.cited.add(len(table.lines))
            shown = name if row in cited else row_name(data, row, result.id)
            table.lines.append(([word, shown], values))
    return table


def _steps(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any], pub: Any
) -> Table:
    """The step figures' numbers: a line per (rate, method), a column per step."""
    n = max(
        len((data[c.key].get("pal") or {}).get("step_accuracy", [])) for c in columns
    )
    lines: list[tuple[list[str], list[Value]]] = []
    for c in columns:
        for row in result.rows:
            steps = (data[c.key].get(row) or {}).get("step_accuracy", [])
            values: list[Value] = [
                (steps[k] if k < len(steps) else None, None) for k in range(n)
            ]
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
        values = [(stat_of(data[col.key], row, k), paper.get(k)) for k in keys]
        lines.append(([row_name(data, row, result.id)], values))
    return Table("", ["Method"], heads, lines)


HEAD_KEYS = ("acc", "fg", "last", "aia")


def _heads(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any], pub: Any
) -> Table:
    """The heads: a line per cell, method and head, from each cell's
    heads.json (collected as its metrics' `heads`)."""
    lines: list[tuple[list[str], list[Value]]] = []
    for c in columns:
        heads = (data[c.key] or {}).get(HEADS_KEY) or {}
        for row in result.rows:
            for head, rows in heads.items():
                if row in rows:
                    values: list[Value] = [(rows[row].get(k), None) for k in HEAD_KEYS]
                    lines.append(
                        ([c.label, row_name(data, row, result.id), head], values)
                    )
    return Table("", ["η", "Method", "Head"], ["Acc", "FG", "Last", "AIA"], lines)


def heads_etas(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any]
) -> list[str]:
    """Markdown lines under the heads' table: the η each rule chose per step
    (ridge: solve.eta, fixed or `auto`'s current-task rule; ridge_all: the
    all-task rule), each run's steps `;`-separated, runs `/`-separated."""
    out = [
        "",
        "η per step of each rule, each run (`;` between steps, `/` between runs):",
    ]
    out += ["", "| η | Method | Head | runs |", "|---|---|---|---|"]
    for c in columns:
        heads = (data[c.key] or {}).get(HEADS_KEY) or {}
        for row in result.rows:
            for head in ("ridge", "ridge_all"):
                entry = (heads.get(head) or {}).get(row)
                if entry is None:
                    continue
                runs = " / ".join(
                    "; ".join(f"{e:g}" for e in r) for r in entry["eta_by_step"]
                )
                name = row_name(data, row, result.id)
                out.append(f"| {c.label} | {name} | {head} | {runs} |")
    return out


def _swept(
    result: Result, columns: Sequence[Column], data: Mapping[str, Any], pub: Any
) -> Table:
    """Tables 4-5 and the prompt figures: a line per cell, Acc and FG."""
    pub = list(pub or [])
    lines = []
    for c in columns:
        paper = _published_line(result, c, pub)
        values = [(stat_of(data[c.key], "pal", k), paper.get(k)) for k in ("acc", "fg")]
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
    "heads": _heads,
}
