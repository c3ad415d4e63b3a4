"""Feature shards: the contract between `pal extract` and `pal-solver` (DESIGN §3).

Layout of a features folder::

    step_01/train.h5   task 1's training samples under the prompts of step 1
    step_01/test.h5    groups task_01 … task_XX: test samples of each seen task
    step_02/…

A step folder may hold parts instead (`train-00000.h5`, `train-00001.h5`, …,
one per extraction rank); readers take them in name order as one shard.

Every file is written to a temporary name in its folder and renamed into
place, so a reader never sees a half-written shard. The readers
(`solver.shard_readers`) validate shapes, dtypes, attrs and finiteness against
what is defined here and raise `ShardError` naming the file and fault.
No timestamps are stored: identical content gives identical bytes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from palcore.codes import Missing
from palcore.errors import ShardError
from palcore.outputs import (
    atomic_path,
    exits_when_full,
    free_bytes,
    task_group_name,
)

FORMAT_VERSION = 1
CHUNK_ROWS = 1024  # HDF5 chunk rows; (1024, D) float32 is 3 MB at D = 768
FEATURE_DTYPES = (np.dtype("float32"), np.dtype("float16"))
MISSING_CODES = tuple(int(m) for m in Missing)

_STR = h5py.string_dtype("utf-8")


@dataclass(frozen=True)
class Block:
    """One block of samples: a train shard or one task group of a test shard.

    features: (n, D) float32 or float16; labels: (n,) int64 incremental class
    index; missing: (n,) int8 in {0, 1, 2}; sample_ids: n strings;
    bp_logits: optional (n, C_k) float32, the BP head's logits over seen classes;
    targets: optional (n, C_k) uint8, a multi-label block's multi-hot targets
    (each row's `labels` entry, the label that placed it in its task, among
    them); absent, a row's target is its one label.
    """

    features: np.ndarray
    labels: np.ndarray
    missing: np.ndarray
    sample_ids: Sequence[str]
    bp_logits: np.ndarray | None = None
    targets: np.ndarray | None = None


@dataclass(frozen=True)
class ShardAttrs:
    """File-level attrs. `provenance` values are str/int/float (JSON for nested)."""

    step: int
    classes_seen: int
    feature_dim: int
    provenance: Mapping[str, str | int | float] = field(default_factory=dict)


# ---------------------------------------------------------------- writing


def write_train(path: str | Path, block: Block, attrs: ShardAttrs) -> Path:
    """Write a train shard atomically (temp name in the same folder, then rename)."""
    _check_block(block, attrs, f"{path}")
    fill = lambda f: _write_block(f, block, attrs)  # noqa: E731
    return _atomic_write(Path(path), attrs, fill, _nbytes(block))


def write_test(path: str | Path, tasks: Mapping[int, Block], attrs: ShardAttrs) -> Path:
    """Write a test shard: one group per seen task (1-based keys 1..step)."""
    expected = list(range(1, attrs.step + 1))
    if sorted(tasks) != expected:
        raise ShardError(
            f"{path}: test shard of step {attrs.step} needs tasks {expected}, "
            f"got {sorted(tasks)}"
        )
    for task, block in tasks.items():
        _check_block(block, attrs, f"{path}:{task_group_name(task)}")

    def fill(f: h5py.File) -> None:
        for task in expected:
            _write_block(f.create_group(task_group_name(task)), tasks[task], attrs)

    needed = sum(_nbytes(b) for b in tasks.values())
    return _atomic_write(Path(path), attrs, fill, needed)


def _nbytes(block: Block) -> int:
    """About a block's bytes on disk (its arrays; ids at 32 bytes each)."""
    arrays = (
        block.features,
        block.labels,
        block.missing,
        block.bp_logits,
        block.targets,
    )
    return sum(a.nbytes for a in arrays if a is not None) + 32 * len(block.sample_ids)


def _atomic_write(path: Path, attrs: ShardAttrs, fill, needed: int = 0) -> Path:
    free = free_bytes(path.parent)
    try:
        with atomic_path(path) as tmp:
            # track_order keeps attribute order stable; no timestamps are written
            with h5py.File(tmp, "w", track_order=True) as f:
                full = exits_when_full(path, tmp, lambda: needed or None, free, True)
                with full:
                    f.attrs["format_version"] = FORMAT_VERSION
                    f.attrs["step"] = int(attrs.step)
                    f.attrs["classes_seen"] = int(attrs.classes_seen)
                    f.attrs["feature_dim"] = int(attrs.feature_dim)
                    for key in sorted(attrs.provenance):
                        value = attrs.provenance[key]
                        if not isinstance(value, (str, int, float)):
                            value = json.dumps(value, sort_keys=True)
                        f.attrs[key] = value
                    fill(f)
                    f.flush()
    except OSError as exc:
        raise ShardError(f"{path}: cannot write ({hdf5_reason(exc)})") from None
    return path


def _write_block(g: h5py.Group, block: Block, attrs: ShardAttrs) -> None:
    x = block.features
    n, d = x.shape
    chunks = (max(1, min(CHUNK_ROWS, n)), d) if n else None
    g.create_dataset("features", data=x, chunks=chunks)
    g.create_dataset("labels", data=np.asarray(block.labels, dtype=np.int64))
    g.create_dataset("missing", data=np.asarray(block.missing, dtype=np.int8))
    g.create_dataset(
        "sample_ids", data=np.asarray(list(block.sample_ids), dtype=object), dtype=_STR
    )
    if block.bp_logits is not None:
        g.create_dataset("bp_logits", data=np.asarray(block.bp_logits, np.float32))
    if block.targets is not None:
        g.create_dataset("targets", data=np.asarray(block.targets, np.uint8))


def _check_block(block: Block, attrs: ShardAttrs, where: str) -> None:
    x = block.features
    if x.ndim != 2 or x.dtype not in FEATURE_DTYPES:
        raise ShardError(
            f"{where}: features must be (n, D) float32/float16, got {x.shape} {x.dtype}"
        )
    n = x.shape[0]
    if x.shape[1] != attrs.feature_dim:
        raise ShardError(
            f"{where}: features have {x.shape[1]} columns, but "
            f"feature_dim is {attrs.feature_dim}"
        )
    for name in ("labels", "missing"):
        if np.shape(getattr(block, name)) != (n,):
            raise ShardError(f"{where}: {name} must have shape ({n},)")
    if len(block.sample_ids) != n:
        raise ShardError(f"{where}: sample_ids must have {n} entries")
    if not np.issubdtype(np.asarray(block.labels).dtype, np.integer):
        raise ShardError(f"{where}: labels must be integers")
    check_values(
        np.asarray(block.labels), np.asarray(block.missing), attrs.classes_seen, where
    )
    if not np.isfinite(x).all():
        raise ShardError(f"{where}: features contain NaN or Inf")
    if block.bp_logits is not None and np.shape(block.bp_logits) != (
        n,
        attrs.classes_seen,
    ):
        raise ShardError(
            f"{where}: bp_logits must have shape ({n}, {attrs.classes_seen})"
        )
    if block.targets is not None:
        if np.shape(block.targets) != (n, attrs.classes_seen):
            raise ShardError(
                f"{where}: targets must have shape ({n}, {attrs.classes_seen})"
            )
        check_targets(np.asarray(block.targets), np.asarray(block.labels), where)


def hdf5_reason(exc: BaseException) -> str:
    """The innermost parenthesised reason of an HDF5 error, on one line."""
    text = " ".join(str(exc).split())
    return text.split("(")[-1].rstrip(")") if "(" in text else text


def check_values(
    labels: np.ndarray, missing: np.ndarray, classes: int, where: str
) -> None:
    """Labels in [0, classes_seen), missing codes in {0, 1, 2}."""
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ShardError(
            f"{where}: labels must lie in [0, {classes}) (classes_seen), got "
            f"[{labels.min()}, {labels.max()}]"
        )
    if not np.isin(missing, MISSING_CODES).all():
        bad = missing[~np.isin(missing, MISSING_CODES)][0]
        raise ShardError(f"{where}: missing codes must be 0, 1 or 2, got {bad}")


def check_targets(targets: np.ndarray, labels: np.ndarray, where: str) -> None:
    """Multi-hot targets: 0 or 1, each row's label among its targets."""
    if targets.size and not np.isin(targets, (0, 1)).all():
        raise ShardError(f"{where}: targets must be 0 or 1")
    if len(labels):
        hit = targets[np.arange(len(labels)), labels]
        if not hit.all():
            row = int(np.argmin(hit))
            raise ShardError(
                f"{where}: targets row {row} lacks its label {int(labels[row])}"
            )
