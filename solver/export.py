"""`pal-solver export`: copy a features folder out of its project, sealed.

Readers check a shard against the md5 that `dvc.lock` recorded for its path
(`palcore.recorded`), which only the project that made it has. A copy made
here carries `MD5SUMS` at its root: for each file, the md5 its project's
lock recorded (the source's bytes are checked against it first, so a file
damaged before the copy is never sealed as good). `pal-solver solve` and
`evaluate` on the copy, anywhere, check every shard against it; a copy
without one is read with a warning that it cannot be verified, or refused
with `--verified-only`. The shards keep their bytes: nothing is extracted
again to gain a seal.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from palcore.cliutil import clean_errors
from palcore.errors import PalError
from palcore.recorded import (
    SEAL,
    DamagedError,
    md5_of,
    recorded_md5,
    sealed_md5,
    write_seal,
)


def export(source: Path, dest: Path) -> tuple[Path, int]:
    """Copy `source` (a features folder) to `dest` (new) with its seal; the
    seal's path and how many files only their own bytes vouch for (no lock
    or seal recorded them)."""
    if not source.is_dir():
        raise PalError(f"{source}: no such features folder")
    if dest.exists():
        raise PalError(f"{dest}: already exists (export writes a new folder)")
    files = sorted(p for p in source.rglob("*") if p.is_file() and p.name != SEAL)
    if not files:
        raise PalError(f"{source}: holds no files")
    md5s, unvouched = {}, 0
    for path in files:
        md5 = md5_of(path)
        rec, sealed = recorded_md5(path), sealed_md5(path)
        want = rec.md5 if rec else sealed[1] if sealed else None
        if want is not None and want != md5:
            raise DamagedError(
                f"{path}: its bytes differ from what its project recorded "
                "(damaged): `pal verify` names the repair; nothing was exported"
            )
        unvouched += want is None
        md5s[path.relative_to(source).as_posix()] = md5
    tmp = dest.with_name(f".{dest.name}.export")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns(SEAL))
    write_seal(tmp, md5s)
    tmp.rename(dest)
    return dest / SEAL, unvouched


@click.command("export")
@click.argument("source", type=click.Path(file_okay=False))
@click.argument("dest", type=click.Path(file_okay=False))
@clean_errors
def cli(source: str, dest: str) -> None:
    """Copy the features folder SOURCE to DEST with a seal (MD5SUMS).

    Each file's md5 as its project's dvc.lock recorded it, checked against
    the source's bytes first. `pal-solver solve` and `evaluate` then verify
    the copy wherever it goes; SOURCE is usually data/extract or one
    chain's folder of it.
    """
    seal, unvouched = export(Path(source), Path(dest))
    n = len(seal.read_text(encoding="utf-8").splitlines())
    line = f"{dest}: {n} files copied and sealed in {seal.name}"
    if unvouched:
        line += f" ({unvouched} recorded by no lock: sealed as they are)"
    click.echo(line)
