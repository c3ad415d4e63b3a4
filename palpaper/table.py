"""A rendered result as a table: its caption, headers and lines, written as
Markdown and as CSV (palpaper/render.py builds them from the cells)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from palpaper.notes import Footnotes

Stat = Mapping[str, Any]  # {"mean": float, "std": float | None, ...}
Value = tuple[Stat | None, float | None]  # measured, published


def md_cell(text: str) -> str:
    """A label as one Markdown cell: `|` escaped, line breaks as spaces."""
    return " ".join(str(text).replace("|", "\\|").split())


@dataclass
class Table:
    """A rendered result: its caption, headers and lines."""

    caption: str
    labels: list[str]  # the label columns' headers
    values: list[str]  # the value columns' headers
    lines: list[tuple[list[str], list[Value]]]
    protocol: str = ""  # how the run departs from the paper's, for the CSV
    cited: set[int] = field(default_factory=set)  # lines of the paper's numbers
    notes: Footnotes | None = None  # the notes on the paper's numbers shown

    def markdown(self) -> str:
        header = [*self.labels, *self.values]
        out = [
            self.caption,
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for i, (labels, values) in enumerate(self.lines):
            mark = self.notes.line_mark(i) if self.notes else ""
            cells = [md_cell(t) for t in labels[:-1]] + [md_cell(labels[-1]) + mark]
            cells += [self._text(i, j, s, p) for j, (s, p) in enumerate(values)]
            out.append("| " + " | ".join(cells) + " |")
        out += self.notes.markdown() if self.notes else []
        return "\n".join(out) + "\n"

    def _text(self, i: int, j: int, stat: Stat | None, paper: float | None) -> str:
        mark = self.notes.value_mark(i, j) if self.notes else ""
        if i in self.cited:
            return "–" if paper is None else f"{paper:.2f}{mark} (cited)"
        return cell(stat, paper, mark)

    def csv(self) -> str:
        def name(h: str) -> str:
            return h.replace(",", ";")

        cols = [name(h) for h in self.labels]
        cols += ["source"] * bool(self.cited)
        cols += [
            f"{name(h)} {part}"
            for h in self.values
            for part in ("mean", "std", "paper")
        ]
        cols += ["paper notes"] * (self.notes is not None)
        if self.protocol:
            cols.append("departs from the paper's protocol")
        out = [",".join(_quote(c) for c in cols)]
        for i, (labels, values) in enumerate(self.lines):
            row = [_quote(x) for x in labels]
            if self.cited:
                row.append("cited from the paper" if i in self.cited else "measured")
            for stat, paper in values:
                mean = None if stat is None else stat["mean"]
                std = None if stat is None else stat["std"]
                row += [_num(mean), _num(std), _num(paper)]
            if self.notes is not None:
                row.append(_quote(self.notes.csv_text(i, self.values)))
            if self.protocol:
                row.append(_quote(self.protocol))
            out.append(",".join(row))
        return "\n".join(out) + "\n"


def _quote(text: str) -> str:
    """A CSV field: quoted where it holds a comma or a quote (doubled)."""
    if "," not in text and '"' not in text:
        return text
    return '"' + text.replace('"', '""') + '"'


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.4f}"


def cell(stat: Stat | None, paper: float | None, mark: str = "") -> str:
    """'mean ± std (paper)'; one run: 'mean'; no measurement: '–'; `mark`:
    the superscript of the notes on the paper's number, after it."""
    if stat is None or stat.get("mean") is None:
        text = "–"
    elif stat.get("std") is None:
        text = f"{stat['mean']:.2f}"
    else:
        text = f"{stat['mean']:.2f} ± {stat['std']:.2f}"
    return text if paper is None else f"{text} ({paper:.2f}{mark})"
