"""`weights.h5`: the solved classifier of every step (DESIGN §4).

Layout::

    step_01/W   (d, C_1) float64 (the solver dtype)
    step_02/W   (d, C_2)
    …
    attrs: format_version, eta, width, seed, feature_dim, method, dtype, n_steps
           (and first_step when the file starts after step 1)

With `solve.eta: auto` the file attr `eta` is 0 and `eta_auto` is 1, and each
`step_XX` group carries the `eta` chosen for it.

Each `step_XX` group also carries `classes_seen`. No timestamps: the same
inputs and params give the same bytes. The file is written under a temporary
name and renamed into place only when every step is in it.

An η sweep writes one file per η, named `weights-eta<η>.h5` (`weights_name`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from palcore.errors import PalError
from palcore.outputs import (
    exit_disk_full,
    free_bytes,
    is_disk_full,
    step_dir_name,
    temp_path,
)
from palcore.recorded import check_content
from solver.params import SolveParams
from solver.shards import hdf5_reason

FORMAT_VERSION = 1
WEIGHTS_NAME = "weights.h5"
_ATTRS = ("format_version", "eta", "width", "seed", "feature_dim", "method", "dtype")


class WeightsError(PalError, ValueError):
    """A weights file is missing, truncated or breaks the layout above."""


def eta_label(eta: float) -> str:
    """Short exact text for η: 0.1 -> '0.1', 10.0 -> '10', 1e-5 -> '1e-05'."""
    text = f"{eta:g}"
    return text if float(text) == eta else repr(float(eta))


def weights_name(eta: float, sweep: bool) -> str:
    """`weights.h5` for a single η, `weights-eta<η>.h5` for a member of a sweep."""
    return f"weights-eta{eta_label(eta)}.h5" if sweep else WEIGHTS_NAME


@dataclass(frozen=True)
class WeightsInfo:
    """The attrs of a weights file."""

    eta: float
    width: int
    seed: int
    feature_dim: int
    method: str
    dtype: str


class WeightsWriter:
    """Writes `step_XX/W` one step at a time into a temporary file.

    `commit()` renames it onto `path`; `discard()` deletes it, leaving any
    earlier file untouched.
    """

    def __init__(
        self, path: str | Path, info: WeightsInfo, first_step: int = 1
    ) -> None:
        self.path = Path(path)
        self._tmp = temp_path(self.path)
        self._free = free_bytes(self.path.parent)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: h5py.File | None = h5py.File(self._tmp, "w", track_order=True)
        except OSError as exc:
            raise WeightsError(
                f"{self.path}: cannot write ({hdf5_reason(exc)})"
            ) from None
        a = self._file.attrs
        a["format_version"] = FORMAT_VERSION
        a["eta"] = float(info.eta)  # 0: chosen per step (eta_auto)
        if info.eta == 0:
            a["eta_auto"] = 1
        a["width"] = int(info.width)
        a["seed"] = int(info.seed)
        a["feature_dim"] = int(info.feature_dim)
        a["method"] = info.method
        a["dtype"] = info.dtype
        self._dtype = np.dtype(info.dtype)
        if first_step != 1:  # a solve resumed from a state with other η
            a["first_step"] = first_step
        self._n_steps = first_step - 1

    def add_step(self, step: int, W: np.ndarray, eta: float | None = None) -> None:
        """Store W_step: (width, classes_seen) host array (and the η chosen for
        this step, with `eta: auto`)."""
        assert self._file is not None and step == self._n_steps + 1
        g = self._file.create_group(step_dir_name(step))
        g.attrs["classes_seen"] = int(W.shape[1])
        if eta is not None:
            g.attrs["eta"] = float(eta)
        W = np.ascontiguousarray(W, dtype=self._dtype)
        try:
            g.create_dataset("W", data=W)
        except (OSError, RuntimeError) as exc:  # h5py raises either
            self._full(exc, W.nbytes)
            raise
        self._n_steps = step

    def _full(self, exc: BaseException, nbytes: int) -> None:
        """A write that found the disk full: the temporary file removed, one
        line, the process ended (`exit_disk_full`); any other error returns."""
        if is_disk_full(exc):
            self._tmp.unlink(missing_ok=True)
            exit_disk_full(self.path, nbytes, self._free)

    def commit(self) -> Path:
        assert self._file is not None
        self._file.attrs["n_steps"] = self._n_steps
        try:
            self._file.close()
        except (OSError, RuntimeError) as exc:
            self._full(exc, 0)
            raise
        self._file = None
        os.replace(self._tmp, self.path)
        return self.path

    def discard(self) -> None:
        """Remove the temporary file, even when it cannot be closed."""
        try:
            if self._file is not None:
                self._file.close()
        except (OSError, RuntimeError):
            pass  # a failed write: the error the caller raises says what
        finally:
            self._file = None
            self._tmp.unlink(missing_ok=True)


class WeightsFile:
    """A validated weights file: `info`, `n_steps`, `classes_seen[k-1]`, `W(k)`."""

    def __init__(self, path: str | Path, partial: bool = False) -> None:
        self.path = Path(path)
        where = str(self.path)
        with self._open() as f:
            self.info = _read_info(f.attrs, where)
            self.n_steps = int(f.attrs["n_steps"])
            self.first_step = int(f.attrs.get("first_step", 1))
            if self.first_step != 1 and not partial:
                raise WeightsError(
                    f"{where}: holds steps {self.first_step}..{self.n_steps} only "
                    "(solved from a state with another eta); evaluating needs "
                    "the weights of every step"
                )
            steps = range(self.first_step, self.n_steps + 1)
            self.classes_seen: list[int] = [0] * (self.first_step - 1)
            self.classes_seen += [self._classes(f, step) for step in steps]
            self.eta_by_step: list[float] | None = None  # eta: auto's choices
            if int(f.attrs.get("eta_auto", 0)):
                self.eta_by_step = [
                    float(f[step_dir_name(k)].attrs["eta"]) for k in steps
                ]

    def _open(self) -> h5py.File:
        """The file, open for reading, after its bytes are checked against
        what DVC recorded (if anything)."""
        where = str(self.path)
        if not self.path.is_file():
            raise WeightsError(f"{where}: weights file not found")
        check_content(self.path)
        try:
            return h5py.File(self.path, "r")
        except OSError as exc:
            reason = (
                "empty file"
                if self.path.stat().st_size == 0
                else ("truncated or not an HDF5 file")
            )
            raise WeightsError(f"{where}: {reason} ({hdf5_reason(exc)})") from None

    def _classes(self, f: h5py.File, step: int) -> int:
        """Step `step`'s classes_seen, from its W's shape (width, C)."""
        name = f"{step_dir_name(step)}/W"
        if name not in f:
            raise WeightsError(f"{self.path}: dataset '{name}' missing")
        shape = f[name].shape
        if len(shape) != 2 or shape[0] != self.info.width:
            raise WeightsError(
                f"{self.path}: {name} has shape {shape}, expected "
                f"({self.info.width}, classes_seen)"
            )
        return int(shape[1])

    def W(self, step: int) -> np.ndarray:
        """W_step: (width, classes_seen) in the stored dtype."""
        name = f"{step_dir_name(step)}/W"
        try:
            with h5py.File(self.path, "r") as f:
                W = f[name][()]
        except OSError as exc:
            raise WeightsError(
                f"{self.path}: unreadable {name} ({hdf5_reason(exc)})"
            ) from None
        if not np.isfinite(W).all():
            raise WeightsError(f"{self.path}: {name} holds NaN or Inf")
        return W


def _read_info(a: h5py.AttributeManager, where: str) -> WeightsInfo:
    """The file's attrs as a WeightsInfo, after checking every one is there
    and the format is this one."""
    for key in (*_ATTRS, "n_steps"):
        if key not in a:
            raise WeightsError(f"{where}: attr '{key}' missing")
    if int(a["format_version"]) != FORMAT_VERSION:
        raise WeightsError(
            f"{where}: format_version {a['format_version']} is not {FORMAT_VERSION}"
        )
    return WeightsInfo(
        eta=float(a["eta"]),
        width=int(a["width"]),
        seed=int(a["seed"]),
        feature_dim=int(a["feature_dim"]),
        method=_text(a["method"]),
        dtype=_text(a["dtype"]),
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_solved_by(where: str | Path, info: WeightsInfo, params: SolveParams) -> None:
    """Refuse weights that `params` (a `solve:` section) did not produce: the
    width, seed, method, dtype or η differs (a stale or foreign file)."""
    for key in ("width", "seed", "method", "dtype"):
        have, want = getattr(info, key), getattr(params, key)
        if have != want:
            raise WeightsError(
                f"{where}: weights of {key} {have}, but solve.{key} is {want} "
                "(rerun `pal-solver solve`)"
            )
    auto = info.eta == 0
    if auto != params.is_auto or (not auto and info.eta not in params.etas):
        have = "auto" if auto else eta_label(info.eta)
        want = "auto" if params.is_auto else ",".join(map(eta_label, params.etas))
        raise WeightsError(
            f"{where}: weights of eta {have}, but solve.eta is {want} "
            "(rerun `pal-solver solve`)"
        )
