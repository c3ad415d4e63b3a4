"""What "the same output" means on every machine (DESIGN §2, "The same output").

CPU kinds (and GPUs) take other float paths: a GEMM blocked for AVX-512 or
for AVX2 sums in another order, so two runs of the same code agree in every
integer and string and in their floats' high bits, never reliably in the low
ones. Two output folders are *the same* when:

* the same files are there (the contract stamp `contract.json` and a step's
  seal `SHA256SUMS`, both derived from the rest, aside), given the same
  inputs;
* a file's seal of its own floats (`DERIVED_KEYS`: the frozen cache's
  `sha256` attribute, a checkpoint's `hash`) is left out with them;
* every integer, string and byte agrees exactly (pixels, labels, sample ids,
  the shards' attributes, a log's epoch counts);
* every float array agrees to `RTOL` of its own scale:
  max |a − b| <= RTOL · max(max |a|, max |b|), a float scalar likewise.

`RTOL` comes from measurement (`bench/float_paths.py`, bench/README): the
fixture's outputs moved by at most 2.3e-6 of their scale between this
project's CPU code paths, and a tuning's checkpoint by 3.6e-4 (its features
by 1e-3) under the smallest change of behaviour tried (PAL's joint embedding
scaled by 1.001), so 1e-4 sits 40× above the one and 3.6× below the other.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RTOL = 1e-4
# On a GPU (bench/gpu_check.py --parts contracts): bf16 autocast keeps 8 bits
# of mantissa (3.9e-3 a rounding), and cuBLAS's algorithm choice differs per
# card and library version. Provisional, from bf16's rounding over a few
# layers, until a card measures it; the CPU's rule is not relaxed by it.
GPU_RTOL = 2e-2
# Environments that take other CPU kinds' code paths on this one (at or below
# the host's instruction set): torch's own kernels, MKL's GEMM, oneDNN's
# convolutions. bench/float_paths.py and tests/test_sameness.py run under them.
CPU_PATHS = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
    | {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
    | {"ONEDNN_MAX_CPU_ISA": "SSE41"},
}
DERIVED = ("contract.json", "SHA256SUMS")  # made from the other files
DERIVED_KEYS = ("sha256", "hash")  # a seal of a file's own floats (queries.h5, .pt)


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
    """The files of output folders `a` and `b` that are not the same, one
    `Difference` per file: a file in one folder only, its first exact
    difference, or its largest float difference above `rtol`."""
    fa, fb = _files(a), _files(b)
    out = [Difference(n) for n in sorted(set(fa) ^ set(fb))]
    for name in sorted(set(fa) & set(fb)):
        found = compare_files(fa[name], fb[name], name)
        exact = [d for d in found if d.size is None]
        worst = max(found, key=lambda d: d.size or 0.0, default=None)
        if exact:
            out.append(exact[0])
        elif worst is not None and (worst.size or 0.0) > rtol:
            out.append(worst)
    return out


def largest(a: Path, b: Path) -> Difference | None:
    """The largest float difference between the files the two folders share
    (None: every float equal, or none there)."""
    fa, fb = _files(a), _files(b)
    found = [
        d
        for n in sorted(set(fa) & set(fb))
        for d in compare_files(fa[n], fb[n], n)
        if d.size is not None
    ]
    return max(found, key=lambda d: d.size or 0.0, default=None)


def _files(root: Path) -> dict[str, Path]:
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and p.name not in DERIVED
    }


def compare_files(a: Path, b: Path, name: str) -> list[Difference]:
    """The differences between two files of one kind: exact ones (size None)
    and every float array's relative difference (size, 0.0 when equal)."""
    if a.read_bytes() == b.read_bytes():
        return []
    try:
        ta, tb = _load(a), _load(b)
    except Exception:  # unreadable as its kind: compare the bytes only
        return [Difference(name)]
    if ta is None:
        return [Difference(name)]
    return [Difference(name, key, size) for key, size in _walk(ta, tb, "")]


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


def _walk(a: Any, b: Any, key: str) -> Iterator[tuple[str, float | None]]:
    """(key, size) per leaf: None where they differ exactly, the relative
    float difference where both are float arrays or scalars."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            yield key or "keys", None
            return
        for k in sorted(a, key=str):
            if str(k).rsplit("@", 1)[-1] in DERIVED_KEYS:
                continue
            yield from _walk(a[k], b[k], f"{key}.{k}" if key else str(k))
        return
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            yield key or "length", None
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from _walk(x, y, f"{key}[{i}]")
        return
    x, y = _array(a), _array(b)
    if x is None or y is None:
        if not _equal(a, b):
            yield key, None
        return
    if x.shape != y.shape or x.dtype.kind != y.dtype.kind:
        yield key, None
    elif x.dtype.kind not in "fc":
        if not np.array_equal(x, y):
            yield key, None
    else:
        yield key, _relative(x, y)


def _array(value: Any) -> np.ndarray | None:
    """`value` as a NumPy array where it holds numbers (a tensor, an array,
    a float), else None (strings, bools, None: compared exactly)."""
    if isinstance(value, (bool, str, bytes)) or value is None:
        return None
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        value = value.detach()
        value = (value.float() if value.is_floating_point() else value).numpy()
    if isinstance(value, (int, float, np.number, np.ndarray)):
        array = np.asarray(value)
        return array if array.dtype.kind in "iufcb" else None
    return None


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    except Exception:
        return a == b


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
