"""Random up-sampling and the two recursive ridge formulations (DESIGN §4).

After every step both give the joint ridge solution over all rows seen so far,

    W_k = (Σ HᵀH + ηI)⁻¹ Σ HᵀY,    H = max(X W_up, 0),

with one-hot targets Y over the C_k classes seen; W gains zero columns when
new classes arrive. Both keep one state per η, so a sweep over several η
shares the read and the up-sampling of every chunk.

- `GramRLS` (default): G += HᵀH (SYRK, lower triangle) and Q += HᵀY per
  chunk; at a step's end W = (G + ηI)⁻¹Q by Cholesky. The accumulation is
  shared by every η of a sweep; only the factorisation is per η.
- `WoodburyRLS`: the paper's Theorem 1 in batch form (as in ACIL), one update
  per chunk of b rows, with the b×b system solved by Cholesky, never inverted:

      P = R Hᵀ,  S = I + H P = L Lᵀ,  V = P L⁻ᵀ
      R ← R − V Vᵀ                 (R − R Hᵀ (I + H R Hᵀ)⁻¹ H R)
      W ← W + V L⁻¹ (Y − H W)      (W + R_new Hᵀ (Y − H W), as R_new Hᵀ = P S⁻¹)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from solver.backend import Backend
from solver.errors import PalError

METHODS = ("gram", "woodbury")


def upsampling_matrix(feature_dim: int, width: int, seed: int) -> np.ndarray:
    """W_up: (feature_dim, width) float64, uniform in ±1/√feature_dim.

    The contract of DESIGN §4 (torch Linear's init, as ACIL's buffer): generated
    on the host from `numpy.random.default_rng(seed)`, so every backend, the
    solve and the evaluate stage use the same matrix.
    """
    bound = 1.0 / math.sqrt(feature_dim)
    rng = np.random.default_rng(seed)
    return rng.uniform(-bound, bound, size=(feature_dim, width))


class Expander:
    """H = max(X W_up, 0) on the backend, in the solver dtype.

    X: (r, D) float32/float16 host rows; H: (r, width) backend array, C-ordered.
    """

    def __init__(self, backend: Backend, W_up: np.ndarray, dtype: Any) -> None:
        self.backend = backend
        self.dtype = np.dtype(dtype)
        self.W_up = backend.asarray(W_up, dtype=self.dtype)  # (D, width)

    def __call__(self, X: np.ndarray) -> Any:
        xp = self.backend.xp
        H = self.backend.asarray(X).astype(self.dtype) @ self.W_up
        xp.maximum(H, 0, out=H)
        return H


def one_hot(labels: Any, n_classes: int, xp: Any, dtype: Any) -> Any:
    """Y: (r, n_classes) with Y[j, labels[j]] = 1. labels: (r,) int on the backend."""
    Y = xp.zeros((labels.shape[0], n_classes), dtype=dtype)
    Y[xp.arange(labels.shape[0]), labels] = 1
    return Y


class RidgeRLS:
    """Common state: the backend, width d, the η values and the class budget.

    `partial_fit(H, labels, classes_seen)` absorbs one chunk of rows;
    `weights(classes_seen)` returns W_k for every η as host arrays
    (d, classes_seen), in the order of `etas`.
    """

    method = ""

    def __init__(
        self,
        backend: Backend,
        width: int,
        etas: tuple[float, ...],
        max_classes: int,
        dtype: Any = np.float64,
    ) -> None:
        self.backend = backend
        self.xp = backend.xp
        self.width = width
        self.etas = tuple(float(e) for e in etas)
        self.max_classes = max_classes
        self.dtype = np.dtype(dtype)
        self.n_rows_ = 0

    def partial_fit(self, H: Any, labels: Any, classes_seen: int) -> None:
        raise NotImplementedError

    def weights(self, classes_seen: int) -> list[np.ndarray]:
        raise NotImplementedError

    def _check(self, H: Any, classes_seen: int) -> None:
        if classes_seen > self.max_classes:
            raise ValueError(f"classes_seen {classes_seen} > {self.max_classes}")
        if H.shape[1] != self.width:
            raise ValueError(f"H has {H.shape[1]} columns, width is {self.width}")
        self.n_rows_ += H.shape[0]


class GramRLS(RidgeRLS):
    """G += HᵀH, Q += HᵀY per chunk; W = (G + ηI)⁻¹Q by Cholesky per step."""

    method = "gram"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        b = self.backend
        self.G_ = b.sym_empty(self.width, self.dtype)  # (d, d), lower triangle
        self.Q_ = self.xp.zeros((self.width, self.max_classes), dtype=self.dtype)
        self._M = b.sym_empty(self.width, self.dtype)  # factor buffer, reused

    def partial_fit(self, H: Any, labels: Any, classes_seen: int) -> None:
        self._check(H, classes_seen)
        if H.shape[0] == 0:
            return
        self.backend.syrk_(self.G_, H.T)  # G += HᵀH
        # Q += HᵀY, over the range of classes present (a chunk holds one task's)
        lo, hi = int(labels.min()), int(labels.max()) + 1
        Y = one_hot(labels - lo, hi - lo, self.xp, self.dtype)  # (r, hi - lo)
        self.Q_[:, lo:hi] += H.T @ Y

    def weights(self, classes_seen: int) -> list[np.ndarray]:
        b, out = self.backend, []
        Q = self.Q_[:, :classes_seen]
        for eta in self.etas:
            self.xp.copyto(self._M, self.G_)
            b.add_diag_(self._M, eta)
            try:
                L = b.cholesky_(self._M)  # (G + ηI) = L Lᵀ
            except np.linalg.LinAlgError:
                raise PalError(
                    f"solve: G + {eta:g}·I is not positive definite in "
                    f"{self.dtype}; use dtype float64 or a larger eta"
                ) from None
            out.append(b.to_host(b.cho_solve(L, Q)))
        return out


class WoodburyRLS(RidgeRLS):
    """R_0 = I/η; per chunk the batch Woodbury update of R and W (Theorem 1)."""

    method = "woodbury"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        b, d = self.backend, self.width
        self.R_ = []
        for eta in self.etas:
            R = b.sym_empty(d, self.dtype)  # (d, d), lower triangle
            b.add_diag_(R, 1.0 / eta)
            self.R_.append(R)
        self.W_ = [
            self.xp.zeros((d, self.max_classes), dtype=self.dtype) for _ in self.etas
        ]

    def partial_fit(self, H: Any, labels: Any, classes_seen: int) -> None:
        self._check(H, classes_seen)
        if H.shape[0] == 0:
            return
        Y = one_hot(labels, classes_seen, self.xp, self.dtype)  # (b, C_k)
        b = self.backend
        for eta, R, W in zip(self.etas, self.R_, self.W_, strict=True):
            P = b.symm(R, H.T)  # (d, b) = R Hᵀ
            S = H @ P  # (b, b) = H R Hᵀ
            b.add_diag_(S, 1.0)
            try:
                L = b.cholesky_(S)  # I + H R Hᵀ = L Lᵀ
            except np.linalg.LinAlgError:
                raise PalError(
                    f"solve: Woodbury update lost positive definiteness at eta "
                    f"{eta:g} in {self.dtype}; use dtype float64 or method gram"
                ) from None
            V = b.trsm_right_(L, P, trans=True)  # (d, b) = P L⁻ᵀ
            b.syrk_(R, V, alpha=-1.0)  # R ← R − V Vᵀ
            K = b.trsm_right_(L, V, trans=False)  # (d, b) = R_new Hᵀ = P S⁻¹
            Wk = W[:, :classes_seen]  # new classes: zero columns
            Wk += K @ (Y - H @ Wk)  # W ← W + R_new Hᵀ (Y − H W)

    def weights(self, classes_seen: int) -> list[np.ndarray]:
        return [self.backend.to_host(W[:, :classes_seen]).copy() for W in self.W_]


def make_rls(
    method: str,
    backend: Backend,
    width: int,
    etas: tuple[float, ...],
    max_classes: int,
    dtype: Any = np.float64,
) -> RidgeRLS:
    """The RLS state for `method` ('gram' or 'woodbury')."""
    classes = {"gram": GramRLS, "woodbury": WoodburyRLS}
    if method not in classes:
        raise PalError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    return classes[method](backend, width, etas, max_classes, dtype)
