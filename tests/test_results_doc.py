"""The demo tables of docs/RESULTS.md are the committed results, not numbers
typed in. Both are read as committed (a user's experiment rewrites the
workspace's results/)."""

import pytest
from helpers import committed, committed_files

RESULTS = committed("docs/RESULTS.md").splitlines()
PAPER = sorted(p for p in committed_files("results/paper/demo") if p.endswith(".md"))


@pytest.mark.parametrize(
    "table", ["results/demo/table.md", "results/demo/ablation/table.md", *PAPER]
)
def test_results_quote_the_committed_table(table: str) -> None:
    rows = [
        line
        for line in committed(table).splitlines()
        if line.startswith("| ") and not line.startswith("|  |")
    ]
    assert rows, f"{table} has no rows"
    missing = [row for row in rows if row not in RESULTS]
    assert missing == [], f"docs/RESULTS.md lacks these rows of {table}"


def test_every_paper_result_of_the_demo_is_committed() -> None:
    from palpaper.grids import RESULTS as GRIDS

    assert PAPER == sorted(f"results/paper/demo/{r}.md" for r in GRIDS)
