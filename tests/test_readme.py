"""The demo tables of docs/RESULTS.md are the committed results, not numbers
typed in."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")


PAPER = sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "results/paper/demo").glob("*.md")
)


@pytest.mark.parametrize(
    "table", ["results/demo/table.md", "results/demo/ablation/table.md", *PAPER]
)
def test_results_quote_the_committed_table(table: str) -> None:
    rows = [
        line
        for line in (ROOT / table).read_text(encoding="utf-8").splitlines()
        if line.startswith("| ") and not line.startswith("|  |")
    ]
    assert rows, f"{table} has no rows"
    missing = [row for row in rows if row not in RESULTS.splitlines()]
    assert missing == [], f"docs/RESULTS.md lacks these rows of {table}"


def test_every_paper_result_of_the_demo_is_committed() -> None:
    from palpaper.grids import RESULTS

    assert PAPER == sorted(f"results/paper/demo/{r}.md" for r in RESULTS)
