"""What "the same output" means on every machine (DESIGN §2, "The same output").

CPU kinds (and GPUs) take other float paths: a GEMM blocked for AVX-512 or
for AVX2 sums in another order, so two runs of the same code agree in every
integer and string and in their floats' high bits, never reliably in the low
ones. Two output folders are *the same* when:

* the same files are there (the contract stamp `contract.json` and a step's
  seal `SHA256SUMS`, both derived from the rest, aside), given the same
  inputs;
* a seal of floats (`DERIVED_KEYS`: the frozen cache's `sha256` attribute,
  a checkpoint's `hash`, and a shard's record of the checkpoint that made
  it) is left out with them;
* every integer, string and byte agrees exactly (pixels, labels, sample ids,
  the shards' attributes, a log's epoch counts);
* every float array agrees to `RTOL` of its own scale:
  max |a − b| <= RTOL · max(max |a|, max |b|), a float scalar likewise;
  a checkpoint's (`.pt`) to `CHECKPOINT_RTOL`.

Checkpoints are spared because Adam's step is ±lr wherever a gradient is
near 0: a gradient that sums to 0 on one path and to 1e-12 on another moves
a weight by a whole step, and later steps carry it on. MSP's head moved by
2.6e-3 of its scale under the `baseline` kind (one weight of its 4,096-weight
pooler; 1.4e-4 the next), while the features extracted with it moved by
7.4e-6. What a checkpoint computes is held to `RTOL` by the extract jobs
that read it.

A folder is read as its *leaves* (`folder_leaves`): per file, each value
inside it, a float array kept whole and any exact value kept as its sha256.
The contract proof keeps the fixture's leaves as its reference
(`pipeline.stages.contract_proof`): the floats in a `.npz`, the digests in
`reference/index.json`.

`RTOL` comes from measurement (`palbench/float_paths.py`, bench/README): the
fixture's outputs moved by at most 2.3e-6 of their scale between this
project's CPU code paths, checkpoints aside, and the features by 1e-3 under
the smallest change of behaviour tried (PAL's joint embedding scaled by
1.001), so 1e-4 sits 40× above the one and 10× below the other.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RTOL = 1e-4
CHECKPOINT_RTOL = 1e-2  # a .pt's floats: Adam's steps (above); 2.6e-3 measured
# On a GPU (palbench/gpu_check.py --parts contracts): bf16 autocast keeps 8 bits
# of mantissa (3.9e-3 a rounding), and cuBLAS's algorithm choice differs per
# card and library version. Provisional, from bf16's rounding over a few
# layers, until a card measures it; the CPU's rule is not relaxed by it.
GPU_RTOL = 2e-2
# Environments that take other CPU kinds' code paths on this one (at or below
# the host's instruction set): torch's own kernels, MKL's GEMM, oneDNN's
# convolutions. palbench/float_paths.py and tests/test_sameness.py run under them.
CPU_PATHS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
    | {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
    | {"ONEDNN_MAX_CPU_ISA": "SSE41"},
}
DERIVED = ("contract.json", "SHA256SUMS")  # made from the other files
# seals of floats: the frozen cache's and a checkpoint's own, and those a
# shard keeps of the checkpoint that made it
DERIVED_KEYS = ("sha256", "hash", "checkpoint_hash", "extract_key")

Leaf = str | np.ndarray  # an exact value's sha256, or a float array
Leaves = dict[str, dict[str, Leaf]]  # file → key inside it ("": its bytes) → leaf


@dataclass(frozen=True)
class Difference:
    """One file (and key inside it) that is not the same; `size`: the float
    difference relative to the array's scale, None for a difference of
    names, shapes, types or exact values."""

    file: str
    key: str = ""
    size: float | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.key}" if self.key else self.file
        return where if self.size is None else f"{where} ({self.size:.1e})"


def compare_folders(a: Path, b: Path, rtol: float = RTOL) -> list[Difference]:
    """The files of output folders `a` and `b` that are not the same."""
    return compare_leaves(folder_leaves(a), folder_leaves(b), rtol)


def compare_leaves(a: Leaves, b: Leaves, rtol: float = RTOL) -> list[Difference]:
    """One `Difference` per file that is not the same: a file in one only,
    its first exact difference, or its largest float difference above
    `rtol` (a checkpoint's: above `CHECKPOINT_RTOL`, if larger)."""
    out = [Difference(n) for n in sorted(set(a) ^ set(b))]
    for name in sorted(set(a) & set(b)):
        found = leaf_differences(a[name], b[name], name)
        exact = [d for d in found if d.size is None]
        worst = max(found, key=lambda d: d.size or 0.0, default=None)
        if exact:
            out.append(exact[0])
        elif worst is not None and (worst.size or 0.0) > _limit(name, rtol):
            out.append(worst)
    return out


def _limit(name: str, rtol: float) -> float:
    return max(rtol, CHECKPOINT_RTOL) if name.endswith(".pt") else rtol


def largest(a: Path, b: Path) -> Difference | None:
    """The largest float difference between the files the two folders share
    (None: every float equal, or none there)."""
    la, lb = folder_leaves(a), folder_leaves(b)
    found = [
        d
        for n in sorted(set(la) & set(lb))
        for d in leaf_differences(la[n], lb[n], n)
        if d.size is not None
    ]
    return max(found, key=lambda d: d.size or 0.0, default=None)


def compare_files(a: Path, b: Path, name: str) -> list[Difference]:
    """The differences between two files of one kind: exact ones (size None)
    and every float array's relative difference (size, 0.0 when equal)."""
    if a.read_bytes() == b.read_bytes():
        return []
    return leaf_differences(file_leaves(a), file_leaves(b), name)


def folder_leaves(root: Path) -> Leaves:
    """The leaves of every file under `root` but the derived ones."""
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): file_leaves(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in DERIVED
    }


def file_leaves(path: Path) -> dict[str, Leaf]:
    """A file's values by key: h5 datasets and attributes, a checkpoint's
    tensors, JSON's values; other kinds (or a file its kind cannot read) by
    the sha256 of its bytes, under key ""."""
    try:
        tree = _load(path)
    except Exception:  # unreadable as its kind: compare the bytes only
        tree = None
    out: dict[str, Leaf] = {}
    if tree is None:
        out[""] = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        _flatten(tree, "", out)
    return out


def leaf_differences(
    a: dict[str, Leaf], b: dict[str, Leaf], name: str
) -> list[Difference]:
    """Per key: a difference of size None where the two differ exactly (a
    key in one only, an exact value, a shape), else the relative float
    difference."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, np.ndarray) and isinstance(y, np.ndarray):
            same_shape = x.shape == y.shape
            out.append(Difference(name, key, _relative(x, y) if same_shape else None))
        elif x is None or y is None or not isinstance(x, str) or x != y:
            out.append(Difference(name, key))
    return out


def _load(path: Path) -> Any:
    """The file as nested values: h5 as {dataset or attribute: array},
    .pt through torch, JSON and JSON lines parsed; None: compare bytes."""
    suffix = path.suffix
    if suffix == ".h5":
        return _h5(path)
    if suffix == ".pt":
        import torch

        return torch.load(path, map_location="cpu", weights_only=False)
    if suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    if suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    return None


def _h5(path: Path) -> dict[str, Any]:
    import h5py

    out: dict[str, Any] = {}
    with h5py.File(path, "r") as f:

        def visit(name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
            for key, value in obj.attrs.items():
                out[f"{name}@{key}"] = value

        visit("", f)
        f.visititems(visit)
    return out


def _flatten(value: Any, key: str, out: dict[str, Leaf]) -> None:
    """`value`'s leaves into `out`: float arrays whole, anything else (an
    empty container too) as the sha256 of its type, shape and bytes."""
    if isinstance(value, dict) and value:
        for k in sorted(value, key=str):
            if str(k).rsplit("@", 1)[-1] not in DERIVED_KEYS:
                _flatten(value[k], f"{key}.{k}" if key else str(k), out)
        return
    if isinstance(value, (list, tuple)) and value:
        for i, item in enumerate(value):
            _flatten(item, f"{key}[{i}]", out)
        return
    array = _array(value)
    if array is not None and array.dtype.kind in "fc":
        out[key] = array
    elif array is not None:
        head = f"{array.dtype.str}{array.shape}".encode()
        out[key] = hashlib.sha256(
            head + np.ascontiguousarray(array).tobytes()
        ).hexdigest()
    else:  # strings, bools, None, string arrays (whole, never repr's "...")
        text = value.tolist() if isinstance(value, np.ndarray) else value
        tag = f"{type(value).__name__}:{getattr(value, 'shape', '')}:{text!r}"
        out[key] = hashlib.sha256(tag.encode()).hexdigest()


def _array(value: Any) -> np.ndarray | None:
    """`value` as a NumPy array where it holds numbers (a tensor, an array,
    a float), else None (strings, bools, None, empty containers: compared
    exactly)."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        return None
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        value = value.detach()
        value = (value.float() if value.is_floating_point() else value).numpy()
    if isinstance(value, (int, float, np.number, np.ndarray)):
        array = np.asarray(value)
        return array if array.dtype.kind in "iufcb" else None
    return None


def _relative(x: np.ndarray, y: np.ndarray) -> float | None:
    """max |x − y| over the larger of the two arrays' largest magnitude; None
    where the non-finite entries (NaN, inf) are not at the same places."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    fx, fy = np.isfinite(x), np.isfinite(y)
    if not np.array_equal(fx, fy) or not np.array_equal(x[~fx], y[~fy], equal_nan=True):
        return None
    if not fx.any():
        return 0.0
    scale = max(np.abs(x[fx]).max(), np.abs(y[fy]).max())
    diff = np.abs(x[fx] - y[fy]).max()
    return 0.0 if diff == 0 else float(diff / scale)
