"""`pal-solver compare`: a report against the committed one, by the rule for
results (DESIGN §2, "The same output"): the same bytes, or every row's
headline means within the tolerance."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from click.testing import CliRunner
from helpers import committed

from solver.cli import main
from solver.compare import TOLERANCE

GIT = ["-c", "user.name=t", "-c", "user.email=t@example.com"]


def _repo(tmp_path: Path) -> Path:
    """A git repository holding the committed demo report in results/demo."""
    repo = tmp_path / "repo"
    folder = repo / "results" / "demo"
    folder.mkdir(parents=True)
    for name in ("metrics.json", "table.md"):
        (folder / name).write_text(committed(f"results/demo/{name}"))
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), *GIT, "commit", "-qm", "r"], check=True)
    return folder


def _move(folder: Path, row: str, key: str, points: float) -> None:
    path = folder / "metrics.json"
    metrics = json.loads(path.read_text())
    metrics[row][key]["mean"] += points
    path.write_text(json.dumps(metrics))


def _compare(folder: Path, *args: str):
    return CliRunner().invoke(main, ["compare", str(folder), *args])


def test_the_committed_bytes_are_the_same(tmp_path: Path) -> None:
    folder = _repo(tmp_path)
    done = _compare(folder, "--check")
    assert done.exit_code == 0
    assert done.stdout == f"{folder}: the same bytes as committed (2 files)\n"


def test_a_move_within_the_tolerance_is_named_and_passes(tmp_path: Path) -> None:
    folder = _repo(tmp_path)
    _move(folder, "init", "acc", -0.08)  # one test sample of one run flipped
    _move(folder, "pal", "last", 0.25)
    done = _compare(folder, "--check")
    assert done.exit_code == 0, done.output
    assert done.stdout == (
        f"{folder}: 1 of 2 files differ from the committed ones (this machine "
        "took other float paths, or the results changed): the largest "
        "difference of a headline result is 0.25 points (pal last), within "
        f"the tolerance of {TOLERANCE:.2f} points\n"
    )


def test_a_move_beyond_the_tolerance_fails_only_with_check(tmp_path: Path) -> None:
    folder = _repo(tmp_path)
    _move(folder, "frozen", "fg", TOLERANCE + 0.5)
    done = _compare(folder, "--check")
    assert done.exit_code == 1
    assert done.stdout.endswith(
        f"is {TOLERANCE + 0.5:.2f} points (frozen fg), beyond the tolerance of "
        f"{TOLERANCE:.2f} points\n"
    )
    assert _compare(folder).exit_code == 0  # make run's line informs


def test_a_missing_row_or_committed_report_is_one_line(tmp_path: Path) -> None:
    folder = _repo(tmp_path)
    metrics = json.loads((folder / "metrics.json").read_text())
    del metrics["bp"]
    (folder / "metrics.json").write_text(json.dumps(metrics))
    done = _compare(folder)
    assert done.exit_code == 1
    assert done.output == ("Error: the rows differ from the committed ones: bp\n")
    elsewhere = tmp_path / "repo" / "results" / "none"
    elsewhere.mkdir()
    done = _compare(elsewhere)
    assert done.exit_code == 1
    assert done.stderr == f"Error: {elsewhere}: no committed report at HEAD\n"


def test_a_deleted_file_moves_and_a_malformed_row_is_one_line(tmp_path: Path) -> None:
    folder = _repo(tmp_path)
    (folder / "table.md").unlink()
    done = _compare(folder)
    assert done.exit_code == 0
    assert done.stdout.startswith(f"{folder}: 1 of 2 files differ from the committed")
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["pal"]["acc"] = 53.0  # a number where {"mean": …} belongs
    (folder / "metrics.json").write_text(json.dumps(metrics))
    done = _compare(folder)
    assert done.exit_code == 1
    assert done.stderr == (
        f"Error: {folder / 'metrics.json'}: not a report's metrics.json (a row "
        "without {'mean': x} under acc, fg, fg_diag, aia or last)\n"
    )
