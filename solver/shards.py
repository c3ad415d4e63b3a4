"""Feature shards: the contract between `pal extract` and `pal-solver` (DESIGN §3).

Layout of a features folder::

    step_01/train.h5   task 1's training samples under the prompts of step 1
    step_01/test.h5    groups task_01 … task_XX: test samples of each seen task
    step_02/…

A step folder may hold parts instead (`train-00000.h5`, `train-00001.h5`, …,
one per extraction rank); readers take them in name order as one shard.

Every file is written to a temporary name in its folder and renamed into
place, so a reader never sees a half-written shard. Readers validate shapes,
dtypes, attrs and finiteness and raise `ShardError` naming the file and fault.
No timestamps are stored: identical content gives identical bytes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
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
    step_dir_name,
    task_group_name,
)
from palcore.recorded import check_content

FORMAT_VERSION = 1
CHUNK_ROWS = 1024  # HDF5 chunk rows; (1024, D) float32 is 3 MB at D = 768
FEATURE_DTYPES = (np.dtype("float32"), np.dtype("float16"))
MISSING_CODES = tuple(int(m) for m in Missing)

_STEP_DIR = re.compile(r"^step_(\d{2,})$")
_STR = h5py.string_dtype("utf-8")


@dataclass(frozen=True)
class Block:
    """One block of samples: a train shard or one task group of a test shard.

    features: (n, D) float32 or float16; labels: (n,) int64 incremental class
    index; missing: (n,) int8 in {0, 1, 2}; sample_ids: n strings;
    bp_logits: optional (n, C_k) float32, the BP head's logits over seen classes.
    """

    features: np.ndarray
    labels: np.ndarray
    missing: np.ndarray
    sample_ids: Sequence[str]
    bp_logits: np.ndarray | None = None


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
    arrays = (block.features, block.labels, block.missing, block.bp_logits)
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
    _check_values(
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


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class BlockReader:
    """A validated block spread over one or more files (parts, in name order).

    `files[i]` holds rows `offsets[i]:offsets[i+1]`; `group` is "" for a train
    shard or `task_XX` for a test shard.
    """

    files: tuple[Path, ...]
    group: str
    n_rows: int
    feature_dim: int
    classes_seen: int
    has_bp_logits: bool

    @property
    def where(self) -> str:
        name = (
            str(self.files[0]) if len(self.files) == 1 else f"{self.files[0]} (+parts)"
        )
        return f"{name}:{self.group}" if self.group else name

    def iter_chunks(
        self, rows: int, with_bp_logits: bool = False
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]:
        """Yield (features (r, D) as stored, labels (r,) int64, missing (r,) int8,
        bp_logits (r, C) float32 or None) in row chunks of at most `rows`.

        Raises `ShardError` naming the file and row when a chunk holds NaN/Inf
        or cannot be read (a file damaged after validation).
        """
        if rows <= 0:
            raise ValueError(f"rows must be positive, got {rows}")
        for path in self.files:
            where = f"{path}:{self.group}" if self.group else f"{path}"
            with _open(path) as f:
                g = f[self.group] if self.group else f
                x, y, m = g["features"], g["labels"], g["missing"]
                bp = g["bp_logits"] if with_bp_logits and "bp_logits" in g else None
                for start in range(0, x.shape[0], rows):
                    stop = min(start + rows, x.shape[0])
                    try:
                        xc = x[start:stop]
                        yc = y[start:stop]
                        mc = m[start:stop]
                        bc = bp[start:stop] if bp is not None else None
                    except OSError as exc:
                        reason = hdf5_reason(exc)
                        raise ShardError(
                            f"{where}: unreadable rows {start}:{stop} ({reason})"
                        ) from None
                    for name, arr in (("features", xc), ("bp_logits", bc)):
                        if arr is None:
                            continue
                        bad = ~np.isfinite(arr).all(axis=1)
                        if bad.any():
                            row = start + int(np.argmax(bad))
                            raise ShardError(f"{where}: {name} row {row} is NaN or Inf")
                    yield xc, yc, mc, bc

    def read_all(self, with_bp_logits: bool = False) -> tuple[np.ndarray, ...]:
        """Whole block in memory (for test sets): features, labels, missing, bp."""
        parts = list(self.iter_chunks(max(self.n_rows, 1), with_bp_logits))
        if not parts:
            d, c = self.feature_dim, self.classes_seen
            return (
                np.zeros((0, d), np.float32),
                np.zeros(0, np.int64),
                np.zeros(0, np.int8),
                np.zeros((0, c), np.float32) if with_bp_logits else None,
            )
        xs, ys, ms, bs = zip(*parts, strict=True)
        bp = np.concatenate(bs) if bs[0] is not None else None
        return np.concatenate(xs), np.concatenate(ys), np.concatenate(ms), bp

    def sample_ids(self) -> list[str]:
        """The n sample ids of the block, in row order."""
        out: list[str] = []
        for path in self.files:
            with _open(path) as f:
                g = f[self.group] if self.group else f
                try:
                    ids = g["sample_ids"][()]
                except OSError as exc:
                    raise ShardError(
                        f"{path}: unreadable sample_ids ({hdf5_reason(exc)})"
                    ) from None
                out.extend(s.decode() if isinstance(s, bytes) else str(s) for s in ids)
        return out


@dataclass(frozen=True)
class StepShards:
    """The validated shards of one step."""

    step: int
    folder: Path
    classes_seen: int
    feature_dim: int
    train: BlockReader
    test: dict[int, BlockReader]  # task (1-based) -> block


def open_features(features_dir: str | Path, first: int = 1) -> list[StepShards]:
    """Validate a features folder and return its steps in order (first..K).

    Steps before `first` are ignored and may be absent (a solve resumed from a
    state after step first−1). Checks: the folder exists and holds
    `step_<first> … step_K` without gaps; each
    step has a train and a test shard (or parts); attrs, shapes and dtypes are
    as in the contract; one feature_dim across steps; classes_seen never
    decreases. Finiteness is checked when rows are streamed.
    """
    root = Path(features_dir)
    if not root.is_dir():
        raise ShardError(f"{root}: features folder not found")
    found = {}
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            step = int(match.group(1))
            if step in found:
                raise ShardError(f"{child}: step {step} also in {found[step].name}")
            found[step] = child
    found = {k: v for k, v in found.items() if k >= first}
    if not found and first > 1:
        raise ShardError(
            f"{root}: no step folders after step {first - 1} (the solver state "
            f"already holds steps 1..{first - 1})"
        )
    if not found:
        raise ShardError(f"{root}: no step_XX folders (expected step_01, step_02, …)")
    expected = list(range(first, max(found) + 1))
    gaps = [s for s in expected if s not in found]
    if gaps:
        raise ShardError(
            f"{root / step_dir_name(gaps[0])}: step folder missing "
            f"(found steps {sorted(found)})"
        )
    steps: list[StepShards] = []
    for step in expected:
        shards = open_step(found[step], step)
        if steps:
            prev = steps[-1]
            if shards.feature_dim != prev.feature_dim:
                raise ShardError(
                    f"{shards.train.where}: feature_dim {shards.feature_dim} differs "
                    f"from step {prev.step}'s {prev.feature_dim}"
                )
            if shards.classes_seen < prev.classes_seen:
                raise ShardError(
                    f"{shards.train.where}: classes_seen {shards.classes_seen} is "
                    f"below step {prev.step}'s {prev.classes_seen}"
                )
        steps.append(shards)
    return steps


def open_step(folder: str | Path, step: int) -> StepShards:
    """Validate one step folder (train + test shards or parts)."""
    folder = Path(folder)
    train_files = _shard_files(folder, "train")
    test_files = _shard_files(folder, "test")
    for path in (*train_files, *test_files):  # the bytes DVC recorded, if any
        check_content(path)
    train = _block_reader(train_files, "", step)
    tasks = {}
    for task in range(1, step + 1):
        tasks[task] = _block_reader(test_files, task_group_name(task), step)
    extra = _extra_groups(test_files, step)
    if extra:
        raise ShardError(f"{test_files[0]}: unexpected group '{extra}' in step {step}")
    for t in tasks.values():
        if (t.feature_dim, t.classes_seen) != (train.feature_dim, train.classes_seen):
            raise ShardError(
                f"{t.where}: feature_dim/classes_seen ({t.feature_dim}, "
                f"{t.classes_seen}) differ from {train.where}'s "
                f"({train.feature_dim}, {train.classes_seen})"
            )
    return StepShards(step, folder, train.classes_seen, train.feature_dim, train, tasks)


def _shard_files(folder: Path, split: str) -> tuple[Path, ...]:
    single = folder / f"{split}.h5"
    parts = sorted(folder.glob(f"{split}-[0-9][0-9][0-9][0-9][0-9].h5"))
    if single.is_file() and parts:
        raise ShardError(f"{single}: both {split}.h5 and {split}-XXXXX.h5 parts exist")
    if single.is_file():
        return (single,)
    if parts:
        return tuple(parts)
    raise ShardError(f"{single}: shard missing")


def _open(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise ShardError(f"{path}: shard missing") from None
    except OSError as exc:
        reason = "truncated or not an HDF5 file"
        if os.path.getsize(path) == 0:
            reason = "empty file"
        raise ShardError(f"{path}: {reason} ({hdf5_reason(exc)})") from None


def hdf5_reason(exc: BaseException) -> str:
    """The innermost parenthesised reason of an HDF5 error, on one line."""
    text = " ".join(str(exc).split())
    return text.split("(")[-1].rstrip(")") if "(" in text else text


def _block_reader(files: tuple[Path, ...], group: str, step: int) -> BlockReader:
    n_rows, dim, classes, has_bp = 0, None, None, None
    for path in files:
        with _open(path) as f:
            a = f.attrs
            _check_attrs(path, a, step)
            if dim is None:
                dim, classes = int(a["feature_dim"]), int(a["classes_seen"])
            elif (int(a["feature_dim"]), int(a["classes_seen"])) != (dim, classes):
                raise ShardError(f"{path}: attrs differ from {files[0]}")
            if group and group not in f:
                raise ShardError(f"{path}: group '{group}' missing")
            g = f[group] if group else f
            where = f"{path}:{group}" if group else f"{path}"
            n = _check_datasets(g, where, dim, classes)
            stored = a.get("stored_dtype")  # the dtype extract wrote
            if stored is not None and str(g["features"].dtype) != _text(stored):
                raise ShardError(
                    f"{where}: features are {g['features'].dtype} but attr "
                    f"stored_dtype says {_text(stored)} (rewritten since extract): "
                    "rerun its `pal extract`"
                )
            bp = "bp_logits" in g
            if has_bp is not None and bp != has_bp:
                raise ShardError(f"{where}: bp_logits present in some parts only")
            has_bp = bp
            n_rows += n
    return BlockReader(files, group, n_rows, dim, classes, bool(has_bp))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_attrs(path: Path, a: h5py.AttributeManager, step: int) -> None:
    for key in ("format_version", "step", "classes_seen", "feature_dim"):
        if key not in a:
            raise ShardError(f"{path}: attr '{key}' missing")
        value = a[key]
        if not (
            np.ndim(value) == 0 and np.issubdtype(np.asarray(value).dtype, np.integer)
        ):
            raise ShardError(f"{path}: attr '{key}' must be an integer, got {value!r}")
    if int(a["format_version"]) != FORMAT_VERSION:
        raise ShardError(
            f"{path}: format_version {a['format_version']} is not {FORMAT_VERSION}"
        )
    if int(a["step"]) != step:
        raise ShardError(
            f"{path}: attr step is {a['step']}, but the folder is {step_dir_name(step)}"
        )
    if int(a["classes_seen"]) <= 0 or int(a["feature_dim"]) <= 0:
        raise ShardError(f"{path}: classes_seen and feature_dim must be positive")


def _check_datasets(g: h5py.Group, where: str, dim: int, classes: int) -> int:
    for name in ("features", "labels", "missing", "sample_ids"):
        if name not in g:
            raise ShardError(f"{where}: dataset '{name}' missing")
    x = g["features"]
    if x.ndim != 2 or x.dtype not in FEATURE_DTYPES:
        raise ShardError(
            f"{where}: features must be (n, D) float32/float16, got {x.shape} {x.dtype}"
        )
    n = x.shape[0]
    if x.shape[1] != dim:
        raise ShardError(
            f"{where}: features have {x.shape[1]} columns, but attr "
            f"feature_dim is {dim}"
        )
    for name, dtype in (("labels", np.int64), ("missing", np.int8)):
        ds = g[name]
        if ds.shape != (n,) or ds.dtype != dtype:
            raise ShardError(
                f"{where}: {name} must be ({n},) {np.dtype(dtype)}, got "
                f"{ds.shape} {ds.dtype}"
            )
    if g["sample_ids"].shape != (n,):
        raise ShardError(f"{where}: sample_ids must have shape ({n},)")
    if n:
        try:
            labels, missing = g["labels"][()], g["missing"][()]
        except OSError as exc:
            raise ShardError(
                f"{where}: unreadable labels/missing ({hdf5_reason(exc)})"
            ) from None
        _check_values(labels, missing, classes, where)
    if "bp_logits" in g:
        bp = g["bp_logits"]
        if bp.shape != (n, classes) or bp.dtype not in FEATURE_DTYPES:
            raise ShardError(
                f"{where}: bp_logits must be ({n}, {classes}) float32, got "
                f"{bp.shape} {bp.dtype}"
            )
    return n


def _check_values(
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


def _extra_groups(files: tuple[Path, ...], step: int) -> str | None:
    allowed = {task_group_name(t) for t in range(1, step + 1)}
    for path in files:
        with _open(path) as f:
            for name in f:
                if name not in allowed:
                    return name
    return None
