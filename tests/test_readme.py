"""The README's demo tables are the committed results, not numbers typed in."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("table", ["results/table.md", "results/ablation/table.md"])
def test_readme_quotes_the_committed_table(table: str) -> None:
    rows = [
        line
        for line in (ROOT / table).read_text(encoding="utf-8").splitlines()
        if line.startswith("| ") and not line.startswith("|  |")
    ]
    assert rows, f"{table} has no rows"
    missing = [row for row in rows if row not in README.splitlines()]
    assert missing == [], f"README.md lacks these rows of {table}"
