"""`pal verify`: every output dvc.lock names, and DVC's cache behind it,
re-hashed by content.

DVC decides from a file's mtime and size whether it changed, so a flipped bit
with the mtime kept goes unseen, and with the link cache docs/USAGE.md
recommends (`cache.type hardlink,symlink`) an in-place write to an output is a
write to its cache object: the damage then survives `dvc checkout`, and a
`dvc repro -f` of its stage links the damaged object back over the fresh file
(its md5 is already "in the cache"). `pal verify` hashes each output file
dvc.lock records and the cache object of the same md5, and for each damaged
one prints what repairs it: `dvc checkout --relink` where the cache holds the
good bytes, else the cache object to remove and the stage to rerun.

It cannot find a run-cache entry that is consistent with itself but was made
from damaged input (a stage that read a damaged file before the readers
checked their inputs): docs/USAGE.md says how to purge those.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import click

from palcore.cliutil import clean_errors
from palcore.errors import PalError
from palcore.recorded import (
    LOCK,
    Recorded,
    cache_dir,
    cache_object,
    md5_of,
    project_root,
    recorded_outputs,
    remove_partials,
)


@dataclass(frozen=True)
class Damage:
    """One output file that is not what dvc.lock records, and its repair."""

    file: str
    stage: str
    what: str
    repair: str

    def line(self) -> str:
        return f"{self.file} (stage {self.stage}): {self.what}: {self.repair}"


def verify(root: Path, stages: dict[str, set[str]], progress=None) -> list[Damage]:
    """Hash every output file of the lock at `root` of `stages` (stage →
    its outputs DVC does not cache, `cache: false`) and its cache object; the
    damaged ones with their repairs."""
    cache = cache_dir(root)
    found = []
    for rec in sorted(checked(root, stages), key=lambda r: r.path):
        damage = _check(root, cache, rec, cached=rec.out not in stages[rec.stage])
        if damage is not None:
            found.append(damage)
        if progress is not None:
            progress(rec)
    return found


def read_lock(root: Path) -> dict[str, dict]:
    """dvc.lock's stages; a PalError naming the file when there is none or it
    is not the YAML DVC writes (nothing would be checked)."""
    import yaml

    path = root / LOCK
    if not path.is_file():
        raise PalError(
            f"{path}: not found: no output is recorded, so nothing can be "
            "verified (`dvc repro` records them)"
        )
    try:
        stages = (yaml.safe_load(path.read_text(encoding="utf-8")) or {})["stages"]
    except (yaml.YAMLError, UnicodeDecodeError, KeyError, TypeError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise PalError(
            f"{path}: not a lock DVC wrote{at}: `git checkout {LOCK}`"
        ) from None
    if not isinstance(stages, dict):
        raise PalError(f"{path}: not a lock DVC wrote: `git checkout {LOCK}`")
    return stages


def folder_md5(folder: Path) -> str:
    """DVC 3's hash of a folder: the md5 of its manifest (each file's md5 and
    path, sorted by path, as JSON with sorted keys), then `.dir`."""
    entries = [
        {"md5": md5_of(p), "relpath": p.relative_to(folder).as_posix()}
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]
    entries.sort(key=lambda e: e["relpath"])
    text = json.dumps(entries, sort_keys=True)
    return hashlib.md5(text.encode()).hexdigest() + ".dir"


def unlisted(root: Path, stages: dict[str, set[str]]) -> list[Damage]:
    """The folder outputs of `stages` whose manifest (`….dir`) is not in DVC's
    cache: their files cannot be listed, so none of them can be checked. A
    `cache: false` folder (in git; DVC keeps no manifest of it) is checked
    whole instead: its files' manifest hashed here against the lock's."""
    cache = cache_dir(root)
    found = []
    for name, entry in sorted(read_lock(root).items()):
        if name not in stages:
            continue
        for out in entry.get("outs") or []:
            md5, path = str(out.get("md5", "")), str(out.get("path"))
            if not md5.endswith(".dir") or cache_object(cache, md5).is_file():
                continue
            if path in stages[name]:  # cache: false
                if (root / path).is_dir() and folder_md5(root / path) == md5:
                    continue
                what = (
                    "its files are not the ones dvc.lock records (a `cache: "
                    "false` folder, checked whole by its hash)"
                )
                repair = f"`git checkout -- {path}`, or `dvc repro -f -s {name}`"
                found.append(Damage(path, name, what, repair))
                continue
            what = (
                f"its manifest {md5} is not in DVC's cache, so none of its "
                "files can be checked"
            )
            repair = f"`dvc fetch {name}` from a remote, or `dvc repro -f -s {name}`"
            found.append(Damage(path, name, what, repair))
    return found


def checked(root: Path, stages: dict[str, set[str]]) -> list[Recorded]:
    """The output files dvc.lock records for `stages`."""
    return [r for r in recorded_outputs(root).values() if r.stage in stages]


def _check(root: Path, cache: Path, rec: Recorded, cached: bool) -> Damage | None:
    """What is wrong with one output file and the cache object of its md5."""
    work, obj = root / rec.path, cache_object(cache, rec.md5)
    work_ok = work.is_file() and md5_of(work) == rec.md5
    obj_ok = obj.is_file() and md5_of(obj) == rec.md5
    if work_ok and (obj_ok or not cached):
        return None
    rerun = f"dvc repro -f -s {rec.stage}"
    bytes_wrong = (
        "missing" if not work.exists() else "its bytes differ from the lock's md5"
    )
    if work_ok and obj.is_dir():  # not a file: `dvc commit -f` cannot write it
        what = f"its cache object {_shown(obj, root)} is a folder"
        repair = f"`rm -r {_shown(obj, root)} && dvc commit -f {rec.stage}`"
        return Damage(rec.path, rec.stage, what, repair)
    if work_ok:  # a cached output whose object is gone: its write failed, or gc
        what = "not in DVC's cache (its write there failed, or `dvc gc` removed it)"
        return Damage(rec.path, rec.stage, what, f"`dvc commit -f {rec.stage}`")
    if obj_ok:
        return Damage(
            rec.path, rec.stage, bytes_wrong, f"`dvc checkout --relink {rec.out}`"
        )
    if not obj.exists():
        return Damage(
            rec.path, rec.stage, f"{bytes_wrong}, and not in the cache", f"`{rerun}`"
        )
    if work.exists() and _same_file(work, obj):
        what = f"damaged, and so is its cache object (the same file: a {_link(work)})"
    elif work_ok:
        what = f"its cache object {_shown(obj, root)} is damaged"
    else:
        what = f"damaged, and its cache object {_shown(obj, root)} is damaged too"
    return Damage(rec.path, rec.stage, what, f"`rm {_shown(obj, root)} && {rerun}`")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _link(path: Path) -> str:
    return "symbolic link" if path.is_symlink() else "hard link"


def _shown(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def clear_partials(
    root: Path, stages: dict[str, set[str]], found: list[Damage]
) -> list[str]:
    """Remove the `<out>.partial*` folders beside the complete, undamaged
    outputs of `stages` (`palcore.recorded.remove_partials`); the folders
    removed. A damaged output's partial stays: the rerun its repair names
    can resume from it."""
    damaged = {d.stage for d in found}
    outs = {r.out: r for r in checked(root, stages) if r.stage not in damaged}
    return [p for out in sorted(outs) for p in remove_partials(root, outs[out])]


def live_stages(root: Path) -> dict[str, set[str]]:
    """The stages dvc.yaml defines now, as dvc.lock names them (a
    lock keeps entries of stages that are gone: their files are not checked),
    each with its outputs that DVC does not cache (`cache: false`: in git)."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return {
            stage.addressing: {o.def_path for o in stage.outs if not o.use_cache}
            for stage in repo.index.stages
        }


@click.command("verify")
@click.option(
    "--stage",
    "stages",
    multiple=True,
    metavar="NAME",
    help="Only this stage's outputs (its name in dvc.lock, e.g. extract@pal-0); "
    "repeatable. Default: every stage.",
)
@clean_errors
def cli(stages: tuple[str, ...]) -> None:
    """Re-hash every output dvc.lock names, and DVC's cache behind it.

    By content, not mtime: each output file of dvc.lock against the md5 the
    lock records, and the cache object of that md5. Prints one line per
    damaged file with its repair (`dvc checkout --relink`, or the
    cache object to remove and the stage to rerun) and exits 1; exits 0 when
    everything matches. Removes the `<out>.partial*` folders a stopped run
    left beside an output that is complete and matches (DVC restored it from
    its cache later).
    """
    from palcore.progress import tqdm

    root = project_root(Path.cwd() / "x")
    if root is None:
        raise PalError(f"{Path.cwd()}: not in a DVC project (no .dvc/ above it)")
    read_lock(root)
    live = live_stages(root)
    unknown = sorted(set(stages) - set(live))
    if unknown:
        raise PalError(f"--stage {unknown[0]}: no such stage in dvc.yaml")
    chosen = {k: v for k, v in live.items() if not stages or k in stages}
    total = len(checked(root, chosen))
    with tqdm(total=total, desc="verify", unit="file") as bar:
        found = unlisted(root, chosen)
        found += verify(root, chosen, progress=lambda _: bar.update())
    for partial in clear_partials(root, chosen, found):
        click.echo(f"removed {partial}: unfinished work beside a complete output")
    for damage in found:
        click.echo(f"Error: {damage.line()}", err=True)
    if found:
        raise SystemExit(1)
    click.echo(f"verify: {total} output files match dvc.lock and the cache")
