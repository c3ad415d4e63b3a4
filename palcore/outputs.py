"""Atomic outputs: write to a temporary name in the target folder, then rename.

A reader (or DVC) never sees a half-written file, and a run that fails leaves
the earlier output exactly as it was. A process killed mid-write (kill -9)
cannot delete its temporary file: the name `.<name>.tmp.<pid>` matches a
pattern in `.dvcignore`, so DVC never counts it as part of an output, and the
next write of the same file removes the leftovers of dead processes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from palcore.errors import PalError

log = logging.getLogger(__name__)

TEMP_GLOB = ".*.tmp.*"  # also in .dvcignore: DVC never sees a temporary file


def temp_path(path: Path) -> Path:
    """A hidden temporary name next to `path` (same filesystem, so rename is
    atomic); the temporary files of `path` left by dead processes are removed."""
    remove_stale_temps(path)
    return path.with_name(f".{path.name}.tmp.{os.getpid()}")


def remove_stale_temps(path: Path) -> list[Path]:
    """Delete `.<name>.tmp.<pid>` next to `path` whose process is gone (a
    writer killed before its rename); returns the files removed."""
    removed = []
    for tmp in path.parent.glob(f".{path.name}.tmp.*"):
        pid = tmp.name.rpartition(".")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
            log.info("removed %s, left by a writer that was killed", tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path; on success rename it onto `path`, else delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically; an OS error is a `PalError` naming path."""
    try:
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
    except OSError as exc:
        raise PalError(f"{path}: cannot write ({exc.strerror or exc})") from None
    return Path(path)


def step_dir_name(step: int) -> str:
    """`step_01` for step 1 (1-based, at least two digits): the name of a
    step's shard folder, checkpoint (`step_01.pt`) and weights group."""
    return f"step_{step:02d}"


def step_of_name(name: str) -> int | None:
    """The inverse of `step_dir_name`: 3 for `step_03` (a checkpoint: pass
    its stem); None for any other name."""
    digits = name.removeprefix("step_")
    if digits == name or len(digits) < 2 or not digits.isdecimal():
        return None
    return int(digits)


def task_group_name(task: int) -> str:
    """`task_01` for task 1: a task's group in the shards, its column in the
    accuracy matrix's CSV."""
    return f"task_{task:02d}"
