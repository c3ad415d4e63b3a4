"""How far the contracted stages' outputs move between CPU code paths, and
how far the smallest change of behaviour moves them (bench/README, "Float
paths"): the measurement behind `pipeline.sameness.RTOL`.

One machine stands in for several CPU kinds: `ATEN_CPU_CAPABILITY` (torch's
own kernels), `MKL_CBWR` (MKL's GEMM) and `ONEDNN_MAX_CPU_ISA` (oneDNN's
convolutions) take the code paths another CPU's would, at or below the
host's instruction set. The contract fixture (`contract_runs`) runs once per
path with the same code and inputs, and once more with PAL's joint embedding
scaled by 1.001; every output file is compared with the first path's, and
the largest relative float difference is printed per job and file kind.

    .venv/bin/python -m palbench.float_paths                # every job, ~6 min
    .venv/bin/python -m palbench.float_paths --jobs tune/pal --jobs extract/pal
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import click

from pipeline.sameness import CPU_PATHS, DERIVED, compare_files, largest
from pipeline.stages import contract_runs as runs
from pipeline.stages.contract_proof import REFERENCE, WEIGHTS

ROOT = Path(__file__).resolve().parent.parent
PATHS = {"native": {}} | CPU_PATHS  # name → the environment of its code paths
JOINT = "return backbone.encode(h, mask, prompts, read=(0,))[:, 0].float()"
SCALED = "scaled x1.001"


def _edited_tree(where: Path) -> Path:
    """The working tree's code with PAL's joint embedding scaled by 1.001."""
    for rel in ("palcore", "pipeline", "solver"):
        shutil.copytree(ROOT / rel, where / rel)
    for name in ("params.yaml", "contracts.yaml", "contracts.lock"):
        shutil.copy(ROOT / name, where / name)
    pal = where / "pipeline/methods/pal.py"
    text = pal.read_text()
    assert JOINT in text, "pal.py no longer has the joint line this edits"
    pal.write_text(text.replace(JOINT, JOINT + " * 1.001"))
    return where


def _kind(name: str) -> str:
    return Path(name).suffix or name


@click.command()
@click.option("--jobs", "names", multiple=True, help="Fixture jobs (default: all).")
@click.option(
    "--keep",
    type=click.Path(file_okay=False),
    default=None,
    help="Run in this folder and keep it (default: a temporary one).",
)
def main(names: tuple[str, ...], keep: str | None) -> None:
    """Print, per fixture job and file kind, the largest relative difference
    from the native path's outputs under each emulated path and the edit."""
    todo = runs.with_needs(j for j in runs.jobs() if not names or j.name in names)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(keep or tmp)
        runs.build_inputs(ROOT, base / "inputs", ROOT / REFERENCE / WEIGHTS)
        outs: dict[str, runs.Version] = {}
        trees = {name: ROOT for name in PATHS} | {SCALED: _edited_tree(base / "edit")}
        for name, tree in trees.items():
            saved = dict(os.environ)
            os.environ.update(PATHS.get(name, {}))
            try:
                version = runs.Version(tree, base / "out" / name)
                ref = outs.get("native", version)
                runs.run_version(version, todo, base / "inputs", ref)
            finally:
                os.environ.clear()
                os.environ.update(saved)
            outs[name] = version
            click.echo(f"ran {len(todo)} jobs: {name}", err=True)
        _table(todo, outs)


def _table(todo: list[runs.Job], outs: dict[str, runs.Version]) -> None:
    """A row per job and file kind: the largest relative float difference
    from the native path's outputs ('exact' where an exact value differs)."""
    others = [n for n in outs if n != "native"]
    click.echo("| job | file kind | " + " | ".join(others) + " |")
    click.echo("|---|---|" + "---|" * len(others))
    for job in todo:
        native = outs["native"].work / job.name
        kinds: dict[str, dict[str, str]] = {}
        for name in others:
            other = outs[name].work / job.name
            for path in sorted(native.rglob("*")):
                if not path.is_file() or path.name in DERIVED:
                    continue
                rel = path.relative_to(native).as_posix()
                diffs = compare_files(path, other / rel, rel)
                exact = any(d.size is None for d in diffs)
                size = max((d.size or 0.0 for d in diffs), default=0.0)
                cell = kinds.setdefault(_kind(rel), {})
                if exact:
                    cell[name] = "exact"
                elif cell.get(name) != "exact":
                    prior = float(cell.get(name, "0") or 0)
                    cell[name] = f"{max(prior, size):.1e}"
        for kind, cells in sorted(kinds.items()):
            row = " | ".join(cells.get(n, "0") for n in others)
            click.echo(f"| {job.name} | {kind} | {row} |")
    top = {
        n: max(
            (
                largest(outs["native"].work / j.name, outs[n].work / j.name)
                for j in todo
            ),
            key=lambda d: -1.0 if d is None else d.size or 0.0,
        )
        for n in others
    }
    for name, d in top.items():
        click.echo(f"largest under {name}: {d}")


if __name__ == "__main__":
    main()
