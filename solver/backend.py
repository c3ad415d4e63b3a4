"""The array backend, chosen once: NumPy + SciPy on the host, or CuPy on a GPU.

Everything the solver computes goes through a `Backend`: `xp` is the array
module (`numpy` or `cupy`) for the NumPy∩CuPy subset, and a handful of BLAS /
LAPACK kernels whose fastest form differs between the two:

- `syrk_(C, A)`: C += A Aᵀ on the lower triangle (SciPy's in-place `?syrk` on a
  Fortran-ordered C; cuBLAS `syrk` or a full GEMM on the GPU).
- `symm(R, B)`: R B for a symmetric R of which only the lower triangle is valid.
- `cholesky_(M)`: lower Cholesky factor of the symmetric M (lower triangle
  read), overwriting M where the backend can. Never an explicit inverse.
- `cho_solve(L, B)`, `trsm_right_(L, B, trans)`: triangular solves.

Symmetric matrices (G, R) are `sym_empty` arrays whose lower triangle holds the
values; the upper triangle is undefined.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
from scipy.linalg import blas, lapack

from palcore.errors import PalError

log = logging.getLogger(__name__)

DEVICES = ("auto", "cpu", "cuda")


class Backend:
    """NumPy + SciPy (LAPACK/BLAS via OpenBLAS) on the host."""

    name = "numpy"

    def __init__(self) -> None:
        self.xp: Any = np

    def memory(self) -> tuple[str, int]:
        """(where, bytes): the memory a solve on this backend can hold at most
        (the host's physical memory)."""
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return "this machine's memory", int(pages)

    # ------------------------------------------------------------ transfers

    def asarray(self, a: np.ndarray, dtype: Any = None) -> Any:
        """Host array -> backend array (no copy on the host when dtype matches)."""
        return np.asarray(a, dtype=dtype)

    def to_host(self, a: Any) -> np.ndarray:
        """Backend array -> host NumPy array."""
        return np.asarray(a)

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the host)."""

    # ------------------------------------------------------------ kernels

    def sym_empty(self, d: int, dtype: Any) -> Any:
        """(d, d) zeros laid out for the in-place kernels (Fortran order here)."""
        return np.zeros((d, d), dtype=dtype, order="F")

    def add_diag_(self, M: Any, value: float) -> None:
        """M[i, i] += value, in place."""
        idx = self.xp.arange(M.shape[0])
        M[idx, idx] += value

    def syrk_(self, C: Any, A: Any, alpha: float = 1.0) -> None:
        """C += alpha · A Aᵀ on the lower triangle, in place. A: (d, r)."""
        syrk = blas.get_blas_funcs("syrk", (C,))
        out = syrk(alpha, A, beta=1.0, c=C, trans=0, lower=1, overwrite_c=1)
        assert out is C or np.shares_memory(out, C), "syrk must update C in place"

    def symm(self, R: Any, B: Any) -> Any:
        """R B with R symmetric (lower triangle valid). R: (d, d), B: (d, r)."""
        symm = blas.get_blas_funcs("symm", (R, B))
        return symm(1.0, R, B, side=0, lower=1)

    def cholesky_(self, M: Any) -> Any:
        """Lower Cholesky factor of M (lower triangle read), overwriting M.

        Raises `numpy.linalg.LinAlgError` when M is not positive definite.
        """
        potrf = lapack.get_lapack_funcs("potrf", (M,))
        L, info = potrf(M, lower=1, clean=0, overwrite_a=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"Cholesky failed (info {info})")
        return L

    def cho_solve(self, L: Any, B: Any) -> Any:
        """Solve (L Lᵀ) X = B for X. L: (d, d) lower factor, B: (d, c)."""
        potrs = lapack.get_lapack_funcs("potrs", (L, B))
        X, info = potrs(L, B, lower=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"Cholesky solve failed (info {info})")
        return X

    def trsm_right_(self, L: Any, B: Any, trans: bool) -> Any:
        """B L⁻ᵀ (trans) or B L⁻¹, overwriting B when it is Fortran-ordered."""
        trsm = blas.get_blas_funcs("trsm", (L, B))
        return trsm(1.0, L, B, side=1, lower=1, trans_a=int(trans), overwrite_b=1)


class CupyBackend(Backend):
    """CuPy + cuBLAS/cuSOLVER on one GPU. Symmetric matrices are C-ordered."""

    name = "cupy"
    gram_kernel = "syrk"  # "syrk" (cuBLAS syrk, d²r flops) or "gemm" (2d²r)

    def __init__(self, cp: Any) -> None:
        import cupy.cublas
        import cupyx.scipy.linalg

        self.xp = cp
        self._cp = cp
        self._cublas = cupy.cublas
        self._solve_triangular = cupyx.scipy.linalg.solve_triangular

    def memory(self) -> tuple[str, int]:
        total = int(self._cp.cuda.runtime.memGetInfo()[1])
        return f"{_gpu_name(self._cp)}'s memory", total

    def asarray(self, a: np.ndarray, dtype: Any = None) -> Any:
        return self._cp.asarray(a, dtype=dtype)

    def to_host(self, a: Any) -> np.ndarray:
        return self._cp.asnumpy(a)

    def synchronize(self) -> None:
        self._cp.cuda.Device().synchronize()

    def sym_empty(self, d: int, dtype: Any) -> Any:
        return self._cp.zeros((d, d), dtype=dtype)

    def syrk_(self, C: Any, A: Any, alpha: float = 1.0) -> None:
        # A is often Hᵀ of a C-ordered H: hand cuBLAS H itself, transposed, no copy
        At, ops = (A.T, ("T", "N")) if A.T.flags.c_contiguous else (A, ("N", "T"))
        if self.gram_kernel == "gemm":
            self._cublas.gemm(*ops, At, At, out=C, alpha=alpha, beta=1.0)
        else:
            self._cublas.syrk(ops[0], At, out=C, alpha=alpha, beta=1.0, lower=True)

    def _symmetrized(self, M: Any) -> Any:
        cp = self._cp
        S = cp.tril(M)
        S += cp.tril(M, -1).T
        return S

    def symm(self, R: Any, B: Any) -> Any:
        return self._symmetrized(R) @ B

    def cholesky_(self, M: Any) -> Any:
        cp = self._cp
        L = cp.linalg.cholesky(self._symmetrized(M))
        # cuSOLVER reports a non-positive-definite input as NaNs, not an error
        if not bool(cp.isfinite(L.diagonal()).all()):
            raise np.linalg.LinAlgError("Cholesky failed (non-finite factor)")
        return L

    def cho_solve(self, L: Any, B: Any) -> Any:
        Z = self._solve_triangular(L, B, lower=True)
        return self._solve_triangular(L, Z, lower=True, trans="T")

    def trsm_right_(self, L: Any, B: Any, trans: bool) -> Any:
        # B L⁻ᵀ = (L⁻¹ Bᵀ)ᵀ and B L⁻¹ = (L⁻ᵀ Bᵀ)ᵀ
        Xt = self._solve_triangular(L, B.T, lower=True, trans="T" if not trans else "N")
        return Xt.T


def _cupy_or_reason() -> tuple[Any | None, str]:
    """(cupy, "") when a GPU runs a kernel and a Cholesky solve, else (None, why)."""
    try:
        import cupy as cp
    except Exception as exc:  # ImportError, or a broken CUDA install
        return None, f"cupy not importable ({type(exc).__name__}: {exc})"
    try:
        if not cp.cuda.is_available():
            return None, "cupy finds no CUDA device"
        backend = CupyBackend(cp)
        a = cp.arange(4, dtype=cp.float64) * 2.0  # elementwise kernel (NVRTC)
        M = backend.sym_empty(3, cp.float64)
        backend.syrk_(M, cp.ones((3, 2), dtype=cp.float64))
        backend.add_diag_(M, 1.0)
        L = backend.cholesky_(M)  # cuSOLVER
        x = backend.cho_solve(L, cp.ones((3, 1), dtype=cp.float64))
        ok = abs(float(a.sum()) - 12.0) < 1e-12 and abs(float(x.sum()) - 3 / 7) < 1e-12
        if not ok:
            return None, "cupy smoke test gave wrong numbers"
        return cp, ""
    except Exception as exc:  # CUDARuntimeError, CompileException, LinAlgError, ...
        first = str(exc).splitlines()[0] if str(exc) else ""
        return None, f"cupy smoke test failed ({type(exc).__name__}: {first})"


def get_backend(device: str) -> Backend:
    """The backend for `device` ('cpu', 'cuda' or 'auto').

    'auto' uses CuPy when a GPU passes a kernel + Cholesky smoke test and logs
    the reason when it falls back to NumPy; 'cuda' without a working GPU is a
    `PalError`.
    """
    if device not in DEVICES:
        raise PalError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return Backend()
    cp, reason = _cupy_or_reason()
    if cp is not None:
        log.info("backend: CuPy on %s", _gpu_name(cp))
        return CupyBackend(cp)
    if device == "cuda":
        raise PalError(f"solve.device is 'cuda' but no GPU works: {reason}")
    log.info("backend: NumPy (no GPU: %s)", reason)
    return Backend()


def _gpu_name(cp: Any) -> str:
    try:
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "a CUDA GPU"


__all__ = ["Backend", "CupyBackend", "DEVICES", "get_backend"]
