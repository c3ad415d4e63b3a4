"""Reading feature shards (DESIGN §3): the validating readers of the
contract `solver.shards` defines and writes.

A features folder's steps (`open_features`) or one step (`open_step`): each
shard's attrs, datasets and values are checked against the contract before
anything is read, a shard recorded by DVC against its md5 too, and a fault is
a `ShardError` naming the file and what is wrong.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from palcore.errors import ShardError
from palcore.outputs import step_dir_name, task_group_name
from palcore.recorded import check_features
from solver.shards import (
    FEATURE_DTYPES,
    FORMAT_VERSION,
    check_targets,
    check_values,
    hdf5_reason,
)

_STEP_DIR = re.compile(r"^step_(\d{2,})$")


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
    made_under: str = ""  # attr `params`: the outcome params of its chain
    has_targets: bool = False  # multi-hot targets (a multi-label block)

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

    def read_all(
        self, with_bp_logits: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
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

    def labels(self) -> np.ndarray:
        """The n labels (int64) of the block, in row order, features unread."""
        return self._whole("labels", np.dtype(np.int64))

    def targets(self) -> np.ndarray | None:
        """The (n, C_k) uint8 multi-hot targets of a multi-label block, in
        row order (features unread); None for a single-label block."""
        return self._whole("targets", np.dtype(np.uint8)) if self.has_targets else None

    def _whole(self, name: str, dtype: np.dtype) -> np.ndarray:
        """Dataset `name` of every part, concatenated in row order."""
        out = []
        for path in self.files:
            with _open(path) as f:
                g = f[self.group] if self.group else f
                try:
                    out.append(np.asarray(g[name][()], dtype=dtype))
                except OSError as exc:
                    raise ShardError(
                        f"{path}: unreadable {name} ({hdf5_reason(exc)})"
                    ) from None
        return np.concatenate(out) if out else np.zeros(0, dtype)

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
    found = _step_folders(root, first)
    steps: list[StepShards] = []
    for step in sorted(found):
        shards = open_step(found[step], step)
        if steps:
            _check_follows(shards, steps[-1], steps[0])
        steps.append(shards)
    return steps


def _step_folders(root: Path, first: int) -> dict[int, Path]:
    """The folders step_<first> … step_K of `root`, by step: none twice, no
    gap."""
    if not root.is_dir():
        raise ShardError(f"{root}: features folder not found")
    found: dict[int, Path] = {}
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
    gaps = [s for s in range(first, max(found) + 1) if s not in found]
    if gaps:
        raise ShardError(
            f"{root / step_dir_name(gaps[0])}: step folder missing "
            f"(found steps {sorted(found)})"
        )
    return found


def _check_follows(shards: StepShards, prev: StepShards, first: StepShards) -> None:
    """A step continues the chain of the steps before it: the same
    feature_dim and params, classes_seen never lower."""
    if shards.feature_dim != prev.feature_dim:
        raise ShardError(
            f"{shards.train.where}: feature_dim {shards.feature_dim} differs "
            f"from step {prev.step}'s {prev.feature_dim}"
        )
    first_made, made = first.train.made_under, shards.train.made_under
    if first_made and made and made != first_made:
        raise ShardError(
            f"{shards.folder}: made under other params than step "
            f"{first.step}'s ({_first_difference(first_made, made)}): "
            "the folder mixes runs or variants; keep one chain's steps"
        )
    if shards.classes_seen < prev.classes_seen:
        raise ShardError(
            f"{shards.train.where}: classes_seen {shards.classes_seen} is "
            f"below step {prev.step}'s {prev.classes_seen}"
        )


def open_step(folder: str | Path, step: int) -> StepShards:
    """Validate one step folder (train + test shards or parts)."""
    folder = Path(folder)
    train_files = _shard_files(folder, "train")
    test_files = _shard_files(folder, "test")
    for path in (*train_files, *test_files):  # the bytes DVC recorded, if any
        check_features(path)
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


def _block_reader(files: tuple[Path, ...], group: str, step: int) -> BlockReader:
    n_rows, has_bp, has_targets = 0, None, None
    dim = classes = -1  # from the first file's attrs
    for path in files:
        with _open(path) as f:
            a = f.attrs
            _check_attrs(path, a, step)
            if path == files[0]:
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
            targets = "targets" in g
            if has_targets is not None and targets != has_targets:
                raise ShardError(f"{where}: targets present in some parts only")
            has_targets = targets
            n_rows += n
    with _open(files[0]) as f:
        made_under = _text(f.attrs.get("params", ""))
    return BlockReader(
        files, group, n_rows, dim, classes, bool(has_bp), made_under, bool(has_targets)
    )


def _first_difference(a: str, b: str) -> str:
    """The first key whose value differs between two JSON objects, shown as
    'key: a against b'."""
    import json

    def leaves(obj: object, key: str = "") -> dict[str, object]:
        if isinstance(obj, dict):
            out: dict[str, object] = {}
            for k in sorted(obj):
                out.update(leaves(obj[k], f"{key}.{k}" if key else str(k)))
            return out
        return {key: obj}

    try:
        la, lb = leaves(json.loads(a)), leaves(json.loads(b))
    except ValueError:
        return "attr params"
    for key in sorted(set(la) | set(lb)):
        if la.get(key) != lb.get(key):
            return f"{key}: {lb.get(key)} against {la.get(key)}"
    return "attr params"


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
        check_values(labels, missing, classes, where)
    if "targets" in g:
        t = g["targets"]
        if t.shape != (n, classes) or t.dtype != np.uint8:
            raise ShardError(
                f"{where}: targets must be ({n}, {classes}) uint8, got "
                f"{t.shape} {t.dtype}"
            )
        if n:
            check_targets(t[()], labels, where)
    if "bp_logits" in g:
        bp = g["bp_logits"]
        if bp.shape != (n, classes) or bp.dtype not in FEATURE_DTYPES:
            raise ShardError(
                f"{where}: bp_logits must be ({n}, {classes}) float32, got "
                f"{bp.shape} {bp.dtype}"
            )
    return n


def _extra_groups(files: tuple[Path, ...], step: int) -> str | None:
    allowed = {task_group_name(t) for t in range(1, step + 1)}
    for path in files:
        with _open(path) as f:
            for name in f:
                if name not in allowed:
                    return name
    return None
