"""Solver state that outlives the shards: `pal-solver solve --save-state`.

After step k the RLS statistics hold everything later steps need (Theorem 1):
for `gram` the Gram matrix G = Σ HᵀH (d, d) and Q = Σ HᵀY (d, C_k); for
`woodbury` R (d, d) and W (d, C_k) per η. A state file keeps them, with the
weights W_1..W_k already solved and what produced them (method, width, seed,
dtype, feature_dim, η). `solve --state FILE` starts from it and absorbs only
the shards of steps k+1.., which may be all that is left on disk: the result
equals a solve over every step's shards.

Layout of the HDF5 file (written under a temporary name, then renamed):

    attrs   format_version, method, width, seed, dtype, feature_dim,
            etas (JSON list), step (k), classes_seen (C_k), n_rows,
            sha256 (over the other attrs and every array: `content_digest`)
    gram:   G (d, d) lower triangle valid; Q (d, C_k)
    woodbury: R_<i> (d, d) lower triangle valid, W_<i> (d, C_k) per η i
    weights/<i>/step_XX: W_step (d, C_step) per η i and step 1..k

Size: 8·d² bytes per (d, d) matrix in float64 — 134 MB at d = 4096, 1.8 GB at
d = 15000 (gram: one; woodbury: one per η), plus 8·d·C_k per Q or W.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from palcore.errors import PalError
from palcore.outputs import atomic_path, step_dir_name

FORMAT_VERSION = 1


class StateError(PalError):
    """A solver state file is missing, damaged, or from other settings."""


@dataclass(frozen=True)
class StateInfo:
    """What produced a state, and how far it got."""

    method: str
    width: int
    seed: int
    dtype: str
    feature_dim: int
    etas: tuple[float, ...]
    step: int  # last step absorbed
    classes_seen: int
    n_rows: int


@dataclass
class SolverState:
    """A state file's content: `arrays` as in the module doc (host arrays),
    `weights[i][k]`: W_k for η i, for the steps whose weights were solved
    with these η (all of 1..k unless a gram state was resumed with other η)."""

    info: StateInfo
    arrays: dict[str, np.ndarray]
    weights: list[dict[int, np.ndarray]]


def save_state(path: str | Path, state: SolverState) -> Path:
    """Write `state` to `path` atomically."""
    path = Path(path)
    info = state.info
    try:
        with atomic_path(path) as tmp, h5py.File(tmp, "w", track_order=True) as f:
            a = f.attrs
            a["format_version"] = FORMAT_VERSION
            for key in ("method", "width", "seed", "dtype", "feature_dim"):
                a[key] = getattr(info, key)
            a["etas"] = json.dumps(list(info.etas))
            a["step"], a["classes_seen"] = info.step, info.classes_seen
            a["n_rows"] = info.n_rows
            for name, array in state.arrays.items():
                f.create_dataset(name, data=np.ascontiguousarray(array))
            for i, per_step in enumerate(state.weights):
                group = f.create_group(f"weights/{i}")
                for k, W in sorted(per_step.items()):
                    group.create_dataset(step_dir_name(k), data=W)
            a["sha256"] = content_digest(state)
    except OSError as exc:
        raise StateError(f"{path}: cannot write the solver state ({exc})") from None
    return path


def load_state(path: str | Path) -> SolverState:
    """Read a state file; a missing or damaged one is a one-line `StateError`."""
    path = Path(path)
    if not path.is_file():
        raise StateError(f"{path}: solver state not found")
    try:
        with h5py.File(path, "r") as f:
            a = f.attrs
            if int(a.get("format_version", -1)) != FORMAT_VERSION:
                raise StateError(f"{path}: not a solver state (format_version)")
            info = StateInfo(
                method=_text(a["method"]),
                width=int(a["width"]),
                seed=int(a["seed"]),
                dtype=_text(a["dtype"]),
                feature_dim=int(a["feature_dim"]),
                etas=tuple(float(e) for e in json.loads(_text(a["etas"]))),
                step=int(a["step"]),
                classes_seen=int(a["classes_seen"]),
                n_rows=int(a["n_rows"]),
            )
            arrays = {k: f[k][()] for k in f if k != "weights"}
            weights = [
                {int(name[5:]): W[()] for name, W in f[f"weights/{i}"].items()}
                for i in range(len(info.etas))
            ]
            held = _text(a.get("sha256", ""))
    except (OSError, KeyError, ValueError) as exc:
        raise StateError(f"{path}: damaged solver state ({exc})") from None
    state = SolverState(info, arrays, weights)
    if held != content_digest(state):
        raise StateError(
            f"{path}: solver state does not match the sha256 written with it "
            "(damaged); solve without --state to start from step 1"
        )
    return state


def content_digest(state: SolverState) -> str:
    """sha256 over the info (JSON) and every array (name, dtype, shape, bytes)
    as `load_state` reads them back: a damaged state is never resumed from."""
    info = {
        k: [float(e) for e in v] if k == "etas" else v if isinstance(v, str) else int(v)
        for k, v in asdict(state.info).items()
    }  # as read back: numbers saved as NumPy scalars load as Python ones
    h = hashlib.sha256(json.dumps(info, sort_keys=True).encode())
    named = [(k, v) for k, v in sorted(state.arrays.items())]
    for i, per_step in enumerate(state.weights):
        named += [(f"weights/{i}/{k}", W) for k, W in sorted(per_step.items())]
    for name, array in named:
        array = np.ascontiguousarray(array)
        h.update(f"{name}|{array.dtype.str}|{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()


def check_state(path: str | Path, info: StateInfo, expected: dict[str, Any]) -> None:
    """Refuse a state whose settings differ from `expected` (method, width,
    seed, dtype, feature_dim, and etas for woodbury), naming the first."""
    for key, want in expected.items():
        have = getattr(info, key)
        if key == "etas" and info.method != "woodbury":
            continue  # G and Q do not depend on η: a gram state serves any η
        if have != want:
            raise StateError(
                f"{path}: state from {key} {_show(have)}, but this solve has "
                f"{key} {_show(want)}"
            )


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" for v in value)
    return str(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
