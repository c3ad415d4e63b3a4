"""docs/DESIGN.md stays a design document: at most 450 lines, a table of contents
that matches its headings, and a table of guarantees whose every row names a test
that exists. The rooms' one-way imports (DESIGN §9) are checked here too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "DESIGN.md"
MAX_LINES = 450
MAX_PROSE_WIDTH = 100  # table rows aside: a table cannot wrap
ROW = re.compile(
    r"^\| (?P<what>[^|]+) \| `(?P<file>tests/[\w/]+\.py)::(?P<test>\w+)` \|$"
)
TOC_ENTRY = re.compile(r"^- \[(?P<text>[^\]]+)\]\(#(?P<anchor>[^)]+)\)$")


def design_lines(text: str | None = None) -> list[str]:
    return (DESIGN.read_text(encoding="utf-8") if text is None else text).splitlines()


def guarantees(lines: list[str]) -> list[tuple[str, str]]:
    """(file, test) of every row of the table under `## 10. Guarantees`."""
    start = lines.index("## 10. Guarantees")
    rows = [line for line in lines[start:] if line.startswith("| ")][1:]  # header off
    found = []
    for row in rows:
        m = ROW.match(row)
        assert m, f"not a guarantee row: {row!r}"
        found.append((m["file"], m["test"]))
    return found


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }


def missing_tests(rows: list[tuple[str, str]], root: Path) -> list[str]:
    """`file::test` of each row whose file is absent or defines no such test."""
    bad = []
    for file, test in rows:
        path = root / file
        if not path.is_file() or test not in defined_tests(path):
            bad.append(f"{file}::{test}")
    return bad


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces '-'."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_guarantee_names_a_test_that_exists() -> None:
    rows = guarantees(design_lines())
    assert len(rows) >= 30
    assert len(set(rows)) == len(rows)
    assert missing_tests(rows, ROOT) == []


def test_a_row_naming_a_test_that_is_gone_is_found(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_here():\n    pass\n\ndef helper():\n    def test_nested(): ...\n",
        encoding="utf-8",
    )
    text = (
        "## 10. Guarantees\n\n| guarantee | test |\n|---|---|\n"
        "| a | `tests/test_x.py::test_here` |\n"
        "| b | `tests/test_x.py::test_nested` |\n"
        "| c | `tests/test_y.py::test_here` |\n"
    )
    rows = guarantees(design_lines(text))
    assert rows == [
        ("tests/test_x.py", "test_here"),
        ("tests/test_x.py", "test_nested"),
        ("tests/test_y.py", "test_here"),
    ]
    assert missing_tests(rows, tmp_path) == [
        "tests/test_x.py::test_nested",
        "tests/test_y.py::test_here",
    ]


def test_design_is_short_and_its_prose_wrapped() -> None:
    lines = design_lines()
    assert len(lines) <= MAX_LINES
    wide = [
        n
        for n, line in enumerate(lines, 1)
        if len(line) > MAX_PROSE_WIDTH and not line.startswith("|")
    ]
    assert wide == []


def test_the_contents_match_the_headings() -> None:
    lines = design_lines()
    start = lines.index("## Contents")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    entries = [TOC_ENTRY.match(line) for line in lines[start + 1 : end] if line]
    assert all(entries)
    headings = [line[3:] for line in lines[end:] if line.startswith("## ")]
    assert [m["text"] for m in entries] == headings
    assert [m["anchor"] for m in entries] == [anchor(h) for h in headings]
    numbered = [h.split(".")[0] for h in headings]
    assert numbered == [str(n) for n in range(1, len(headings) + 1)]


def test_anchor_follows_githubs_rule() -> None:
    assert anchor("2. Stages, the cache and output contracts") == (
        "2-stages-the-cache-and-output-contracts"
    )
    assert anchor("The paper's results") == "the-papers-results"


# DESIGN §9: the rooms and the arrows they may not take. Imports inside
# functions count; `solver` → palcore only is held by tests/test_solver_api.py.
FORBIDDEN = {
    "palcore": ("pipeline", "solver", "palpaper"),
    "solver": ("pipeline", "palpaper"),
    "pipeline": ("palpaper",),
    "pipeline/model": ("pipeline.methods", "pipeline.stages", "click"),
    "pipeline/data": ("pipeline.model", "pipeline.methods", "pipeline.stages", "click"),
    "pipeline/methods": ("pipeline.stages", "click"),
}


def wrong_way(root: Path) -> list[str]:
    """`path:line module` for each import against FORBIDDEN below `root`."""
    bad = []
    for folder, banned in FORBIDDEN.items():
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                    names += [f"{node.module}.{a.name}" for a in node.names]
                else:
                    continue
                for name in names:
                    if any(name == b or name.startswith(b + ".") for b in banned):
                        bad.append((str(path.relative_to(root)), node.lineno, name))
                        break
    return [f"{path}:{line} {name}" for path, line, name in sorted(bad)]


def test_the_rooms_import_one_way() -> None:
    assert wrong_way(ROOT) == []


def test_a_wrong_way_import_is_found(tmp_path: Path) -> None:
    model = tmp_path / "pipeline" / "model"
    model.mkdir(parents=True)
    (model / "x.py").write_text(
        "import pipeline.data\nimport click\n"
        "def f():\n    from pipeline import methods\n"
        "from pipeline.methods.pal import Pal\n",
        encoding="utf-8",
    )
    assert wrong_way(tmp_path) == [
        "pipeline/model/x.py:2 click",
        "pipeline/model/x.py:4 pipeline.methods",
        "pipeline/model/x.py:5 pipeline.methods.pal",
    ]
