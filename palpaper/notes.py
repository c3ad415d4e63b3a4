"""Footnotes on the paper's numbers: published.yaml's `notes:` (what is odd
about given published values) and `fg_forms:` (the forgetting each published
row may use), as markers and texts for a rendered table.

A note names its values by method (the paper's row name), metric (`acc`,
`fg`) and the result's column key; a table marks each such value it shows
(the paper's number beside a measured one, or a cited one) with the note's
number as a superscript, and prints the note's text under it. An FG form
marks a whole FG line (every value of the row), after its method's name.
Notes are numbered from 1 in the order published.yaml gives them, the FG
forms after them in the order their first row appears; a note none of whose
values the table shows is left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from palpaper.packaged import published

METRICS = {"Acc": "acc", "FG": "fg"}  # a line's metric word -> published.yaml key
_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")

# a line of a table, as the notes see it: metric word, method name, and for
# each value column whether the paper's number stands there
LineSpec = tuple[str, str, Sequence[bool]]


@dataclass(frozen=True)
class Note:
    """A note on published values: (method, metric, column key) each, its text."""

    cells: tuple[tuple[str, str, str], ...]
    text: str


def cell_notes(rid: str, dataset: str) -> list[Note]:
    """The notes of published.yaml on result `rid`'s numbers for `dataset`."""
    raw = ((published().get("notes") or {}).get(rid) or {}).get(dataset) or []
    return [
        Note(
            tuple((c["method"], c["metric"], c["column"]) for c in note["cells"]),
            " ".join(str(note["text"]).split()),
        )
        for note in raw
    ]


def fg_forms(rid: str, dataset: str) -> dict[str, str]:
    """Method -> the FG form its published row may use (`maximum`,
    `diagonal`, `unknown`), for result `rid` on `dataset`."""
    return dict(((published().get("fg_forms") or {}).get(rid) or {}).get(dataset) or {})


def form_text(form: str) -> str:
    """What an FG form is, and why a row may use it (published.yaml)."""
    return " ".join(str(published()["fg_forms"]["texts"][form]).split())


def superscript(numbers: Sequence[int]) -> str:
    """Note numbers as superscripts, '¹', '¹,⁵'; '' for none."""
    return ",".join(str(n).translate(_SUPERSCRIPT) for n in numbers)


def listed(names: Sequence[str]) -> str:
    """'A', 'A and B', 'A, B and C'."""
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


@dataclass
class Footnotes:
    """The notes a table shows: their texts (numbered from 1), the values
    and lines each marks."""

    texts: list[str] = field(default_factory=list)
    on_values: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    on_lines: dict[int, list[int]] = field(default_factory=dict)

    def value_mark(self, line: int, column: int) -> str:
        return superscript(self.on_values.get((line, column), []))

    def line_mark(self, line: int) -> str:
        return superscript(self.on_lines.get(line, []))

    def markdown(self) -> list[str]:
        """The lines under the table: a paragraph per note."""
        out: list[str] = []
        for n, text in enumerate(self.texts, 1):
            out += ["", f"{superscript([n])} {text}"]
        return out

    def csv_text(self, line: int, labels: Sequence[str]) -> str:
        """The CSV's notes of a line: '[n] <columns>: text' for a note on some
        of its values, '[n] text' for one on the whole line."""
        parts = []
        marked: dict[int, list[str]] = {}
        for (i, j), numbers in sorted(self.on_values.items()):
            if i != line:
                continue
            for n in numbers:
                marked.setdefault(n, []).append(labels[j])
        for n in sorted({*marked, *self.on_lines.get(line, [])}):
            where = f" {', '.join(marked[n])}:" if n in marked else ""
            parts.append(f"[{n}]{where} {self.texts[n - 1]}")
        return " ".join(parts)


def footnotes(
    rid: str, dataset: str, keys: Sequence[str], lines: Sequence[LineSpec]
) -> Footnotes | None:
    """The footnotes of a table of result `rid` on `dataset` whose value
    columns have the keys `keys`; None when it shows no value a note names."""
    index = {key: j for j, key in enumerate(keys)}
    where = {
        (METRICS[word], method): i
        for i, (word, method, _) in enumerate(lines)
        if word in METRICS
    }
    out = Footnotes()
    for note in cell_notes(rid, dataset):
        hits = []
        for method, metric, key in note.cells:
            i, j = where.get((metric, method)), index.get(key)
            if i is not None and j is not None and lines[i][2][j]:
                hits.append((i, j))
        if hits:
            out.texts.append(note.text)
            for hit in hits:
                out.on_values.setdefault(hit, []).append(len(out.texts))
    _mark_forms(out, fg_forms(rid, dataset), lines)
    return out if out.texts else None


def _mark_forms(
    out: Footnotes, forms: Mapping[str, str], lines: Sequence[LineSpec]
) -> None:
    """An FG form's note on each FG line that shows its row's paper numbers."""
    rows: dict[str, list[tuple[int, str]]] = {}  # form -> (line, method)
    for i, (word, method, shown) in enumerate(lines):
        if METRICS.get(word) == "fg" and method in forms and any(shown):
            rows.setdefault(forms[method], []).append((i, method))
    for form, marked in rows.items():
        methods = [m for _, m in marked]
        out.texts.append(
            f"FG of the paper's {listed(methods)} rows: {form_text(form)}."
        )
        for i, _ in marked:
            out.on_lines.setdefault(i, []).append(len(out.texts))
