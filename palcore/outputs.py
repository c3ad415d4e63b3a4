"""Atomic outputs: write to a temporary name in the target folder, then rename.

A reader (or DVC) never sees a half-written file, and a run that fails leaves
the earlier output exactly as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from palcore.errors import PalError


def temp_path(path: Path) -> Path:
    """A hidden temporary name next to `path` (same filesystem, so rename is atomic)."""
    return path.with_name(f".{path.name}.tmp.{os.getpid()}")


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


def task_group_name(task: int) -> str:
    """`task_01` for task 1: a task's group in the shards, its column in the
    accuracy matrix's CSV."""
    return f"task_{task:02d}"
