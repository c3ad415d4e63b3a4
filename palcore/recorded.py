"""What DVC recorded of an output's content, and reading against it.

DVC trusts a file's mtime and size: a bit flipped in a feature shard with its
mtime kept (disk rot, `rsync -t`) passes `dvc status`, and a stage reading it
would put wrong results into `dvc.lock` and the run-cache. But DVC recorded
the md5 of every output file when the stage that wrote it finished: in a
lock file (an output file) or in the directory manifest in its cache (a file
inside an output folder, `<cache>/files/md5/ab/cdef….dir`). `recorded_md5`
finds that md5 without DVC's own code (the solver runs without it), and
`check_content` compares a file's bytes with it: readers call it on every
file they read from a DVC output, before they read it, so a damaged file ends
the reading stage with one line and nothing reaches the lock. A file that no
lock records (a stage run by hand outside `dvc repro`) is not checked.
"""

from __future__ import annotations

import configparser
import functools
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from palcore.errors import PalError

log = logging.getLogger(__name__)
LOCK = "dvc.lock"  # the lock of the project's one pipeline file, dvc.yaml


class DamagedError(PalError):
    """A file's bytes differ from what DVC recorded when its stage wrote it."""


@dataclass(frozen=True)
class Recorded:
    """One output file as a lock records it: its path under the project, its
    md5, the stage that wrote it and the output (file or folder) it is in."""

    path: str
    md5: str
    stage: str
    out: str


def project_root(path: Path) -> Path | None:
    """The folder above `path` that holds `.dvc/` (None: not in a project)."""
    for folder in Path(path).resolve().parents:
        if (folder / ".dvc").is_dir():
            return folder
    return None


def cache_dir(root: Path) -> Path:
    """DVC's cache folder: `cache.dir` of .dvc/config.local or .dvc/config
    (relative to .dvc/), else .dvc/cache."""
    for name in ("config.local", "config"):
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        try:
            parser.read(root / ".dvc" / name, encoding="utf-8")
        except configparser.Error:
            continue
        if parser.has_option("cache", "dir"):
            return (root / ".dvc" / parser.get("cache", "dir")).resolve()
    return root / ".dvc" / "cache"


def cache_object(cache: Path, md5: str) -> Path:
    """Where DVC 3 keeps the object of `md5` (a folder's manifest: `….dir`)."""
    return cache / "files" / "md5" / md5[:2] / md5[2:]


def md5_of(path: Path) -> str:
    """md5 of a file's bytes, read in 1 MiB blocks (DVC's hash of a file)."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def recorded_outputs(root: Path) -> dict[str, Recorded]:
    """Every output file the project's lock records, by path under `root`."""
    lock = _stamp(root / LOCK)
    return _recorded_outputs(root.resolve(), lock, _stamp(cache_dir(root)))


@functools.lru_cache(maxsize=4)
def _recorded_outputs(root: Path, *_: object) -> dict[str, Recorded]:
    """(cached while the lock is unchanged)"""
    cache = cache_dir(root)
    found: dict[str, Recorded] = {}
    path = root / LOCK
    if not path.is_file():
        return found
    try:
        stages = (yaml.safe_load(path.read_text(encoding="utf-8")) or {})["stages"]
    except (yaml.YAMLError, KeyError, TypeError, UnicodeDecodeError):
        return found
    for name, entry in stages.items():
        for out in entry.get("outs") or []:
            found.update(_files_of(out, name, cache))
    return found


def _files_of(out: dict, stage: str, cache: Path) -> dict[str, Recorded]:
    """The files of one lock `outs` entry (paths relative to the project's
    root, where dvc.yaml is)."""
    where, md5 = str(out.get("path", "")), str(out.get("md5", ""))
    if not md5.endswith(".dir"):
        return {where: Recorded(where, md5, stage, where)} if md5 else {}
    try:
        listing = json.loads(cache_object(cache, md5).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # the manifest is not here: nothing to check against
    return {
        f"{where}/{e['relpath']}": Recorded(
            f"{where}/{e['relpath']}", e["md5"], stage, where
        )
        for e in listing
        if isinstance(e, dict) and "relpath" in e and "md5" in e
    }


def recorded_md5(path: Path) -> Recorded | None:
    """What the project's lock records of the file at `path`, if anything."""
    root = project_root(path)
    if root is None:
        return None
    try:
        rel = Path(path).resolve().relative_to(root).as_posix()
    except ValueError:
        return None
    return recorded_outputs(root).get(rel)


def check_content(path: Path) -> None:
    """Raise DamagedError when the bytes of `path` differ from the md5 DVC
    recorded for it; nothing when it matches or nothing records it. The
    first good file of an output also clears the output's stale partial
    folders (`remove_partials`)."""
    rec = recorded_md5(Path(path))
    if rec is None:
        return
    if md5_of(Path(path)) == rec.md5:
        root = project_root(Path(path))
        if root is not None and (root, rec.out) not in _CLEARED:
            _CLEARED.add((root, rec.out))
            remove_partials(root, rec)
        return
    raise DamagedError(
        f"{path}: its bytes differ from the md5 that {LOCK} "
        f"recorded when stage {rec.stage} wrote it (damaged since): `pal verify "
        f"--stage {rec.stage}` checks its cache copy and names the repair"
    )


_CLEARED: set[tuple[Path, str]] = set()  # outputs whose partials were cleared


def remove_partials(root: Path, rec: Recorded) -> list[str]:
    """Remove `<out>.partial*` beside the complete output `rec.out`: the
    finished steps of a run that was stopped, left there when DVC later
    restored the stage from its run-cache (no stage code runs then, so no
    code of the stage's can remove them; the next reader of the output, or
    `pal verify`, does). A partial folder beside a complete output is never
    resumed: a stage runs only after DVC removed its output. Returns the
    folders removed, relative to `root`, each also logged."""
    out = root / rec.out
    removed: list[str] = []
    if not out.exists():
        return removed
    for partial in sorted(out.parent.glob(f"{out.name}.partial*")):
        shutil.rmtree(partial) if partial.is_dir() else partial.unlink()
        removed.append(partial.relative_to(root).as_posix())
        log.info(
            "removed %s: the unfinished work of an earlier run of stage %s, whose "
            "output is complete (DVC restored it from its cache)",
            removed[-1],
            rec.stage,
        )
    return removed


# --- features that travel: a seal beside them ----------------------------------

SEAL = "MD5SUMS"  # at the root of a copied features folder: "<md5>  <relpath>"
REQUIRE_VERIFIED = False  # `--verified-only`: refuse what nothing records
_WARNED: set[Path] = set()  # the folder named as unverifiable (once a process)


class UnverifiedError(PalError):
    """A file that no lock and no seal records, read under `--verified-only`."""


def sealed_md5(path: Path) -> tuple[Path, str] | None:
    """(the seal file, the md5 it lists for `path`) from the nearest `SEAL`
    in a folder above `path` that lists it; None when none does."""
    path = Path(path).resolve()
    for folder in path.parents:
        seal = folder / SEAL
        if seal.is_file():
            listed = _read_seal(seal, *(_stamp(seal) or (0, 0)))
            md5 = listed.get(path.relative_to(folder).as_posix())
            if md5 is not None:
                return seal, md5
    return None


@functools.lru_cache(maxsize=16)
def _read_seal(seal: Path, *_: object) -> dict[str, str]:
    """(cached while the seal file is unchanged)"""
    out = {}
    for line in seal.read_text(encoding="utf-8", errors="replace").splitlines():
        md5, sep, rel = line.partition("  ")
        if sep and len(md5) == 32:
            out[rel] = md5
    return out


def check_features(path: Path) -> None:
    """`check_content` for a features file, which may have travelled out of
    the project that made it: no lock records it there, so the `SEAL` that
    `pal-solver export` writes beside the copy is checked instead. With
    neither, one warning in the process says it cannot be verified (an
    error under `REQUIRE_VERIFIED`)."""
    if recorded_md5(Path(path)) is not None:
        check_content(path)
        return
    sealed = sealed_md5(path)
    if sealed is not None:
        seal, md5 = sealed
        if md5_of(Path(path)) != md5:
            raise DamagedError(
                f"{path}: its bytes differ from the md5 that {seal} lists "
                "(damaged since it was sealed): copy it again from its source"
            )
        return
    line = (
        f"{Path(path).parent}: cannot verify its shards: no {LOCK} records them "
        f"and no {SEAL} lists them (`pal-solver export` copies features with one)"
    )
    if REQUIRE_VERIFIED:
        raise UnverifiedError(f"{line}; --verified-only refuses them")
    if not _WARNED:  # once a process: the first such folder stands for all
        _WARNED.add(Path(path).parent)
        log.warning(f"{line}; so are any others read unsealed")


def write_seal(folder: Path, files: dict[str, str]) -> Path:
    """`SEAL` in `folder`: {path relative to folder: md5}, written atomically."""
    text = "".join(f"{md5}  {rel}\n" for rel, md5 in sorted(files.items()))
    seal = Path(folder) / SEAL
    tmp = seal.with_name(f".{SEAL}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(seal)
    return seal
