"""`pal-solver compare`: a report against the committed one, by the project's
rule for results (DESIGN §2, "The same output").

The committed `results/demo/` is what one machine made. Another CPU kind
takes other float paths, and on the demo's 400 test samples a near-tie can
fall the other way: a prediction or two moves, and Acc moves by a quarter of
a point in one run. So a report is *the same* as the committed one when its
files are byte for byte those committed, or else when every row's headline
results (Acc, FG, FG_diag, AIA, Last: the mean over runs) are within
`TOLERANCE` points of the committed ones, and the rows are the same.
`TOLERANCE` comes from measurement (bench/README, "Float paths").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import click

from palcore.cliutil import clean_errors
from palcore.errors import PalError

TOLERANCE = 1.0  # points, on each row's mean of each headline result
HEADLINE = ("acc", "fg", "fg_diag", "aia", "last")


class CompareError(PalError):
    """A report that cannot be compared (no committed copy, not a report)."""


def committed_report(folder: Path, commit: str = "HEAD") -> dict[str, bytes]:
    """The files committed directly in `folder` at `commit`: {name: bytes}
    (sub-folders, such as the ablation's report, are reports of their own)."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(folder), *args], capture_output=True)

    if not folder.is_dir() or git("rev-parse", "--git-dir").returncode:
        raise CompareError(f"{folder}: not a folder in a git work tree")
    listed = git("ls-tree", "-z", commit, "./")
    out = {}
    for entry in listed.stdout.split(b"\0") if listed.returncode == 0 else []:
        meta, _, name = entry.partition(b"\t")
        if meta.split()[1:2] == [b"blob"]:
            sha = meta.split()[2].decode()
            out[Path(name.decode()).name] = git("cat-file", "blob", sha).stdout
    return out


def headline_gaps(
    ours: dict[str, Any], theirs: dict[str, Any]
) -> list[tuple[float, str]]:
    """(|difference| in points, 'row key') for every headline mean of every
    row; a row or key in one report only is a CompareError."""
    rows = {k for k, v in theirs.items() if isinstance(v, dict) and "acc" in v}
    mine = {k for k, v in ours.items() if isinstance(v, dict) and "acc" in v}
    if rows != mine:
        odd = sorted(rows ^ mine)
        raise CompareError(f"the rows differ from the committed ones: {', '.join(odd)}")
    gaps = []
    for row in sorted(rows):
        for key in HEADLINE:
            a, b = ours[row].get(key), theirs[row].get(key)
            if a is None or b is None:
                if a is not b:
                    raise CompareError(f"{row}.{key}: in one report only")
                continue
            gaps.append((abs(float(a["mean"]) - float(b["mean"])), f"{row} {key}"))
    return gaps


def compare_line(folder: Path, commit: str = "HEAD", tolerance: float = TOLERANCE):
    """(one line saying how `folder`'s report compares with the committed
    one, whether it is within the tolerance)."""
    files = committed_report(folder, commit)
    if not files:
        raise CompareError(f"{folder}: no committed report at {commit}")
    moved = [
        n
        for n, data in files.items()
        if not (folder / n).is_file() or (folder / n).read_bytes() != data
    ]
    if not moved:
        return f"{folder}: the same bytes as committed ({len(files)} files)", True
    metrics = folder / "metrics.json"
    if "metrics.json" not in files or not metrics.is_file():
        raise CompareError(f"{metrics}: no metrics.json here and committed")
    try:
        ours = json.loads(metrics.read_text(encoding="utf-8"))
        gaps = headline_gaps(ours, json.loads(files["metrics.json"]))
    except ValueError as exc:
        raise CompareError(f"{metrics}: not JSON ({exc})") from None
    except (KeyError, TypeError, AttributeError):
        raise CompareError(
            f"{metrics}: not a report's metrics.json (a row without "
            "{'mean': x} under acc, fg, fg_diag, aia or last)"
        ) from None
    gap, where = max(gaps, default=(0.0, "none"))
    within = gap <= tolerance
    verdict = "within" if within else "beyond"
    return (
        f"{folder}: {len(moved)} of {len(files)} files differ from the committed "
        f"ones (this machine took other float paths, or the results changed): "
        f"the largest difference of a headline result is {gap:.2f} points "
        f"({where}), {verdict} the tolerance of {tolerance:.2f} points"
    ), within


@click.command("compare")
@click.argument("folder", type=click.Path(file_okay=False), default="results/demo")
@click.option(
    "--commit", default="HEAD", show_default=True, help="Compare with this commit's."
)
@click.option(
    "--tolerance",
    type=float,
    default=TOLERANCE,
    show_default=True,
    help="Points a headline mean (Acc, FG, FG_diag, AIA, Last) may move.",
)
@click.option(
    "--check", is_flag=True, help="Exit 1 when beyond the tolerance (CI's use)."
)
@clean_errors
def cli(folder: str, commit: str, tolerance: float, check: bool) -> None:
    """Compare the report in FOLDER with the one committed there.

    One line: the same bytes, or how far each row's headline results moved
    (another CPU kind takes other float paths: DESIGN §2, "The same
    output"). With --check, beyond the tolerance exits 1.
    """
    line, within = compare_line(Path(folder), commit, tolerance)
    click.echo(line)
    if check and not within:
        raise SystemExit(1)
