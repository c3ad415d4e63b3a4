"""The solver benchmark's (bench/solver) in-process measurements: the BLAS floor at the
solve's sizes, through the solver's own backend, and ACIL's reference update."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the project, installed or not

import numpy as np  # noqa: E402
from procs import Run  # noqa: E402  (bench/solver/)

from solver.api import get_backend, upsampling_matrix  # noqa: E402

ETA = 1.0


class Kernels:
    """The floor's kernels on one device: the solver's own backend
    (`solver.backend`: its SYRK, Cholesky and solves), so the floor times the
    very calls the solver makes."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.backend = get_backend(device)
        self.xp = self.backend.xp

    def sync(self) -> None:
        self.backend.synchronize()

    def asarray(self, a: np.ndarray) -> object:
        return self.backend.asarray(a)

    def host(self, a: object) -> np.ndarray:
        return self.backend.to_host(a)

    def zeros_sym(self, d: int) -> object:
        return self.backend.sym_empty(d, np.float64)

    def syrk(self, G: object, H: object) -> None:
        """G (lower) += HᵀH over all rows of H (n, d)."""
        self.backend.syrk_(G, H.T)

    def chol_solve(self, M: object, Q: object) -> object:
        """Factor M = L Lᵀ (lower triangle read, overwritten) and solve M W = Q."""
        return self.backend.cho_solve(self.backend.cholesky_(M), Q)


def timed(k: Kernels, fn: Callable[[], object]) -> tuple[Run, object]:
    """Wall and CPU (this process, all threads) seconds of fn(), and its result."""
    k.sync()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    k.sync()
    return Run(time.perf_counter() - wall, time.process_time() - cpu), out


def warm_up(k: Kernels) -> None:
    xp = k.xp
    a = k.asarray(np.random.default_rng(0).random((1024, 1024)))
    for _ in range(3):
        a @ a
        M = k.zeros_sym(512)
        k.syrk(M, a[:, :512])
        M[xp.arange(512), xp.arange(512)] += 1.0
        k.chol_solve(M, k.asarray(np.ones((512, 4))))
    k.sync()


class Floor:
    """The unavoidable BLAS work at the solve's sizes, measured in this process.

    GEMM X·W_up over all rows + one SYRK over all rows + per step one Cholesky
    of G + ηI (the final G) and its two triangular solves with C_k columns.
    `measure()` times every part once; call it between the solve runs so the
    floor and the solves see the same machine load, and keep each part's best.
    """

    def __init__(self, k: Kernels, X: np.ndarray, y: np.ndarray, seen: list[int],
                 width: int) -> None:  # fmt: skip
        xp = self.xp = k.xp
        self.k, self.width, self.seen = k, width, seen
        self.W_up = k.asarray(upsampling_matrix(X.shape[1], width, 0))
        self.X64 = k.asarray(X.astype(np.float64))
        H = xp.maximum(self.X64 @ self.W_up, 0)
        self.G = k.zeros_sym(width)
        k.syrk(self.G, H)
        Y = xp.zeros((len(y), seen[-1]))
        Y[xp.arange(len(y)), k.asarray(y)] = 1.0
        self.Q = H.T @ Y
        self.H = H
        self.M = k.zeros_sym(width)
        self.runs: list[dict[str, Run]] = []
        self.syrk_kernels: dict[str, float] = {}
        if k.device == "cuda":  # cuBLAS syrk or a full GEMM: keep the faster
            for kernel in ("syrk", "gemm"):
                k.backend.gram_kernel = kernel
                self.syrk_kernels[kernel] = min(self._syrk()[0].wall for _ in range(3))
            k.backend.gram_kernel = min(self.syrk_kernels, key=self.syrk_kernels.get)
        self.W_joint = k.host(self._chol(seen[-1])[1])

    def _syrk(self) -> tuple[Run, object]:
        G = self.k.zeros_sym(self.width)
        return timed(self.k, lambda: self.k.syrk(G, self.H))

    def _chol(self, c: int) -> tuple[Run, object]:
        M = self.M
        M[...] = self.G
        self.k.backend.add_diag_(M, ETA)
        return timed(self.k, lambda: self.k.chol_solve(M, self.Q[:, :c]))

    def measure(self) -> None:
        gemm, _ = timed(self.k, lambda: self.X64 @ self.W_up)
        syrk, _ = self._syrk()
        chols = [self._chol(c)[0] for c in self.seen]
        chol = Run(sum(r.wall for r in chols), sum(r.cpu for r in chols))
        self.runs.append({"gemm": gemm, "syrk": syrk, "chol": chol})

    def best(self) -> dict[str, Run]:
        """Per part, the best of the measured runs; 'floor' is their sum."""
        parts = {
            p: Run.best([r[p] for r in self.runs]) for p in ("gemm", "syrk", "chol")
        }
        parts["floor"] = Run(sum(r.wall for r in parts.values()),
                             sum(r.cpu for r in parts.values()))  # fmt: skip
        return parts


def acil_reference(
    k: Kernels,
    Xs: list[np.ndarray],
    ys: list[np.ndarray],
    seen: list[int],
    width: int,
    batch: int = 4096,
) -> tuple[Run, np.ndarray]:
    """ACIL's RecursiveLinear.fit as written, per ≤ 4096-row batch within a step."""
    xp = k.xp
    W_up = k.asarray(upsampling_matrix(Xs[0].shape[1], width, 0))
    d = width
    k.sync()
    wall, cpu = time.perf_counter(), time.process_time()
    R = xp.eye(d) / ETA
    W = xp.zeros((d, 0))
    for X_k, y_k, c in zip(Xs, ys, seen, strict=True):
        for lo in range(0, len(y_k), batch):
            X = xp.maximum(k.asarray(X_k[lo : lo + batch].astype(np.float64)) @ W_up, 0)
            if W.shape[1] < c:
                W = xp.concatenate([W, xp.zeros((d, c - W.shape[1]))], axis=1)
            Y = xp.zeros((X.shape[0], c))
            Y[xp.arange(X.shape[0]), k.asarray(y_k[lo : lo + batch])] = 1.0
            K = xp.linalg.inv(xp.eye(X.shape[0]) + X @ R @ X.T)
            R -= R @ X.T @ K @ X @ R
            W += R @ X.T @ (Y - X @ W)
    k.sync()
    run = Run(time.perf_counter() - wall, time.process_time() - cpu)
    return run, k.host(W)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))
