"""Atomic outputs: write to a temporary name in the target folder, then rename.

A reader (or DVC) never sees a half-written file, and a run that fails leaves
the earlier output exactly as it was. A process killed mid-write (kill -9)
cannot delete its temporary file: the name `.<name>.tmp.<pid>` matches a
pattern in `.dvcignore`, so DVC never counts it as part of an output, and the
next write of the same file removes the leftovers of dead processes.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import NoReturn

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


def is_disk_full(exc: BaseException) -> bool:
    """An error of a write that found no space (errno ENOSPC, or HDF5's
    message for it: h5py raises OSError or RuntimeError with its text)."""
    return getattr(exc, "errno", None) == errno.ENOSPC or (
        "No space left on device" in str(exc)
    )


def exit_disk_full(
    path: Path, needed: int | None, free: int | None, kept: str = ""
) -> NoReturn:
    """End the process with one line after a write to `path` found its disk
    full: about how many bytes the file needs (`needed`, when known) and how
    many were free when the writing began (`free`). The caller removed its
    temporary file first. HDF5 cannot close a file whose write failed for
    lack of space (it segfaults trying, at exit), so this ends the process at
    once, after the line, without finalising it."""
    parts = [f"it needs about {_size(needed)}" if needed else ""]
    parts.append(f"{_size(free)} were free when it began" if free is not None else "")
    said = "; ".join(p for p in parts if p)
    line = f"Error: {path}: the disk is full{f' ({said})' if said else ''}: free "
    line += f"space there and rerun{kept}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


@contextmanager
def exits_when_full(
    path: Path,
    tmp: Path,
    needed: Callable[[], int | None],
    free: int | None,
    hold_stderr: bool = False,
) -> Iterator[None]:
    """Around the writes (and a final flush) of an open HDF5 file `tmp` that
    becomes `path`: a write that finds the disk full removes `tmp` and ends
    the process with one line (`exit_disk_full`) before HDF5 tries to close
    the file, which it cannot do after such a failure. `hold_stderr`: what is
    printed meanwhile is held back and dropped on that exit (h5py prints a
    traceback for each of its objects freed as the failed write unwinds);
    for short writes only, as a progress bar would be held too."""
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held) if hold_stderr else nullcontext():
            yield
    except (OSError, RuntimeError) as exc:  # h5py raises either for a failed write
        if is_disk_full(exc):
            tmp.unlink(missing_ok=True)
            exit_disk_full(path, needed(), free)
        raise
    finally:
        sys.stderr.write(held.getvalue())


def free_bytes(folder: Path) -> int | None:
    """The bytes free on the file system of `folder` (or of its nearest
    existing parent); None where that cannot be read."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def _quiet_disk_full(unraisable: sys.UnraisableHookArgs) -> None:
    """h5py reports a failed close of a file whose disk is full as an
    "exception ignored" (a traceback) while the stack unwinds; the writer
    says it in one line (`exit_disk_full`), so those are not printed."""
    exc = unraisable.exc_value
    if exc is None or not is_disk_full(exc):
        sys.__unraisablehook__(unraisable)


sys.unraisablehook = _quiet_disk_full


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically; an OS error is a `PalError` naming path."""
    free = free_bytes(Path(path).parent)
    try:
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
    except OSError as exc:
        if is_disk_full(exc):
            exit_disk_full(Path(path), len(data), free)
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
