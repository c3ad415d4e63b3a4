"""Random up-sampling and the two recursive ridge formulations (DESIGN §4).

After every step both give the joint ridge solution over all rows seen so far,

    W_k = (Σ HᵀH + ηI)⁻¹ Σ HᵀY,    H = max(X W_up, 0),

with one-hot targets Y over the C_k classes seen; W gains zero columns when
new classes arrive. Both keep one state per η, so a sweep over several η
shares the read and the up-sampling of every chunk.

- `GramRLS` (default): G += HᵀH (SYRK, lower triangle) and Q += HᵀY per
  chunk; at a step's end W = (G + ηI)⁻¹Q by Cholesky. The accumulation is
  shared by every η of a sweep; only the factorisation is per η. While the
  rows seen so far are few (N ≤ d/2) and it costs fewer flops, a step's W is
  solved in the equal dual form W = Hᵀ(H Hᵀ + ηI)⁻¹Y instead: an N×N Cholesky
  per η in place of a d×d one, with H regenerated from the kept input rows.
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

from palcore.errors import PalError
from solver.backend import Backend

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
        H = self.pre(X)
        xp.maximum(H, 0, out=H)
        return H

    def pre(self, X: np.ndarray) -> Any:
        """Z = X W_up, the pre-activation (H = max(Z, 0)): DS-AL's tanh(Z)."""
        return self.backend.asarray(X).astype(self.dtype) @ self.W_up


def make_expander(
    backend: Backend, feature_dim: int, width: int, seed: int, dtype: Any
) -> Expander:
    """The Expander of `upsampling_matrix(feature_dim, width, seed)`: the one
    place the solve stage and every classifier build it."""
    return Expander(backend, upsampling_matrix(feature_dim, width, seed), dtype)


def one_hot(labels: Any, n_classes: int, xp: Any, dtype: Any) -> Any:
    """Y: (r, n_classes) with Y[j, labels[j]] = 1. labels: (r,) int on the backend."""
    Y = xp.zeros((labels.shape[0], n_classes), dtype=dtype)
    Y[xp.arange(labels.shape[0]), labels] = 1
    return Y


def targets_matrix(targets: Any, classes_seen: int, xp: Any, dtype: Any) -> Any:
    """Y (r, classes_seen) of a chunk's targets on the backend: one-hot rows
    of labels (r,) int, or multi-hot rows (r, c), c <= classes_seen, of a
    multi-label shard (`Block.targets`), padded with zero columns."""
    if targets.ndim == 1:
        return one_hot(targets, classes_seen, xp, dtype)
    Y = xp.zeros((targets.shape[0], classes_seen), dtype=dtype)
    Y[:, : targets.shape[1]] = targets
    return Y


class RidgeRLS:
    """Common state: the backend, width d, the η values and the class budget.

    `partial_fit(H, labels, classes_seen)` absorbs one chunk of rows (labels
    (r,) int, or a multi-label chunk's multi-hot targets (r, c): each column
    then an independent ridge, the ridge itself unchanged);
    `weights(classes_seen)` returns W_k for every η as host arrays
    (d, classes_seen), in the order of `etas` (gram: or of the `etas` it is
    given, e.g. the one η that `solve.eta: auto` chose for the step).
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

    def partial_fit(
        self, H: Any, labels: Any, classes_seen: int, X: np.ndarray | None = None
    ) -> None:
        """Absorb rows H (r, d) with labels (r,); X (r, D): the rows H came from."""
        raise NotImplementedError

    def weights(
        self, classes_seen: int, etas: tuple[float, ...] | None = None
    ) -> list[np.ndarray]:
        raise NotImplementedError

    def export_state(self, classes_seen: int) -> dict[str, np.ndarray]:
        """The statistics later steps need, as host arrays (`solver.state`)."""
        raise NotImplementedError

    def import_state(self, arrays: dict[str, np.ndarray], n_rows: int) -> None:
        """Continue from `export_state`'s arrays (`n_rows` rows absorbed)."""
        raise NotImplementedError

    def _absorb(self, H: Any, classes_seen: int) -> None:
        """Check a chunk's shape against the solver and count its rows."""
        if classes_seen > self.max_classes:
            raise ValueError(f"classes_seen {classes_seen} > {self.max_classes}")
        if H.shape[1] != self.width:
            raise ValueError(f"H has {H.shape[1]} columns, width is {self.width}")
        self.n_rows_ += H.shape[0]


class GramRLS(RidgeRLS):
    """G += HᵀH, Q += HᵀY per chunk; W = (G + ηI)⁻¹Q by Cholesky per step."""

    method = "gram"
    dual_block = 1024  # columns of H regenerated at a time in the dual form

    def __init__(self, *args: Any, expand: Expander | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        b = self.backend
        self.G_ = b.sym_empty(self.width, self.dtype)  # (d, d), lower triangle
        self.Q_ = self.xp.zeros((self.width, self.max_classes), dtype=self.dtype)
        self._M = b.sym_empty(self.width, self.dtype)  # factor buffer, reused
        # host input rows and labels seen so far, kept for the dual form while
        # they number at most d/2 (then K = H Hᵀ is at most a quarter of G)
        self._expand = expand
        self._X: list[np.ndarray] | None = [] if expand is not None else None
        self._y: list[np.ndarray] = []
        self.dual_steps_ = 0  # steps solved in the dual form

    def partial_fit(
        self, H: Any, labels: Any, classes_seen: int, X: np.ndarray | None = None
    ) -> None:
        self._absorb(H, classes_seen)
        if H.shape[0] == 0:
            return
        self.backend.syrk_(self.G_, H.T)  # G += HᵀH
        if labels.ndim == 2:  # multi-hot targets (r, c): Q[:, :c] += HᵀY
            self.Q_[:, : labels.shape[1]] += H.T @ labels.astype(self.dtype)
        else:  # Q += HᵀY over the range of classes present (one task's)
            lo, hi = int(labels.min()), int(labels.max()) + 1
            Y = one_hot(labels - lo, hi - lo, self.xp, self.dtype)  # (r, hi - lo)
            self.Q_[:, lo:hi] += H.T @ Y
        if self._X is not None:
            if X is None or self.n_rows_ > self.width // 2:
                self._X, self._y = None, []  # primal form from here on
            else:
                self._X.append(np.asarray(X))
                self._y.append(self.backend.to_host(labels))

    def _dual_pays(self, classes_seen: int, n_etas: int) -> bool:
        """True when the dual form needs fewer flops than d×d Choleskys."""
        if not self._X:
            return False
        n, D, d = self.n_rows_, self._X[0].shape[1], self.width
        c, e = classes_seen, n_etas
        # two passes regenerating H, K = H Hᵀ, then per η: N×N Cholesky + solves
        dual = (
            4 * n * D * d + n * n * d + e * (n**3 / 3 + 2 * n * n * c + 2 * n * d * c)
        )
        return dual < e * (d**3 / 3 + 2 * d * d * c)

    def _dual_weights(
        self, classes_seen: int, etas: tuple[float, ...]
    ) -> list[np.ndarray]:
        """W = Hᵀ(H Hᵀ + ηI)⁻¹Y over the kept rows, equal to (G + ηI)⁻¹Q."""
        assert self._X is not None and self._expand is not None
        b, xp, dt, blk = self.backend, self.xp, self.dtype, self.dual_block
        X = b.asarray(np.concatenate(self._X)).astype(dt)  # (N, D)
        W_up = self._expand.W_up  # (D, d)
        n, d = X.shape[0], self.width

        def columns(lo: int) -> Any:  # H[:, lo:lo + blk]: (N, blk)
            return xp.maximum(X @ W_up[:, lo : lo + blk], 0)

        K = b.sym_empty(n, dt)  # (N, N), lower triangle
        for lo in range(0, d, blk):
            b.syrk_(K, columns(lo))  # K += H_c H_cᵀ
        Y = xp.concatenate(
            [targets_matrix(b.asarray(y), classes_seen, xp, dt) for y in self._y]
        )
        M, alphas = b.sym_empty(n, dt), []
        for eta in etas:
            xp.copyto(M, K)
            b.add_diag_(M, eta)
            L = self._cholesky(M, eta, "H Hᵀ")
            alphas.append(b.cho_solve(L, Y))  # (N, C) = (H Hᵀ + ηI)⁻¹Y
        Ws = [xp.empty((d, classes_seen), dtype=dt) for _ in etas]
        for lo in range(0, d, blk):
            Hc = columns(lo)
            for W, alpha in zip(Ws, alphas, strict=True):
                W[lo : lo + blk] = Hc.T @ alpha
        return [b.to_host(W) for W in Ws]

    def _cholesky(self, M: Any, eta: float, what: str) -> Any:
        try:
            return self.backend.cholesky_(M)
        except np.linalg.LinAlgError:
            raise PalError(
                f"solve: {what} + {eta:g}·I is not positive definite in "
                f"{self.dtype}; use dtype float64 or a larger eta"
            ) from None

    def export_state(self, classes_seen: int) -> dict[str, np.ndarray]:
        b = self.backend
        return {"G": b.to_host(self.G_), "Q": b.to_host(self.Q_[:, :classes_seen])}

    def import_state(self, arrays: dict[str, np.ndarray], n_rows: int) -> None:
        b = self.backend
        self.G_[...] = b.asarray(arrays["G"], dtype=self.dtype)
        self.Q_[:, : arrays["Q"].shape[1]] = b.asarray(arrays["Q"], dtype=self.dtype)
        self.n_rows_ = n_rows
        self._X, self._y = None, []  # the earlier rows are gone: primal form

    def weights_without(
        self, G_out: Any, Q_out: Any, eta: float, classes_seen: int
    ) -> Any:
        """(G − G_out + ηI)⁻¹ (Q − Q_out)[:, :classes_seen] on the backend: the
        weights fitted without some absorbed rows (their G_out = HᵀH, lower
        triangle, and Q_out = HᵀY), as `solve.eta: auto` scores them."""
        M = self._M
        self.xp.subtract(self.G_, G_out, out=M)
        self.backend.add_diag_(M, eta)
        Q = self.Q_[:, :classes_seen] - Q_out[:, :classes_seen]
        return self.backend.cho_solve(self._cholesky(M, eta, "G - G_out"), Q)

    def weights(
        self, classes_seen: int, etas: tuple[float, ...] | None = None
    ) -> list[np.ndarray]:
        etas = self.etas if etas is None else etas
        if self._dual_pays(classes_seen, len(etas)):
            self.dual_steps_ += 1
            return self._dual_weights(classes_seen, etas)
        b, out = self.backend, []
        Q = self.Q_[:, :classes_seen]
        for eta in etas:
            self.xp.copyto(self._M, self.G_)
            b.add_diag_(self._M, eta)
            L = self._cholesky(self._M, eta, "G")  # (G + ηI) = L Lᵀ
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

    def partial_fit(
        self, H: Any, labels: Any, classes_seen: int, X: np.ndarray | None = None
    ) -> None:
        self._absorb(H, classes_seen)
        if H.shape[0] == 0:
            return
        Y = targets_matrix(labels, classes_seen, self.xp, self.dtype)  # (b, C_k)
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

    def weights(
        self, classes_seen: int, etas: tuple[float, ...] | None = None
    ) -> list[np.ndarray]:
        # each η's W is updated row by row: no other η can be solved for here
        assert etas is None or tuple(etas) == self.etas
        return [self.backend.to_host(W[:, :classes_seen]).copy() for W in self.W_]

    def export_state(self, classes_seen: int) -> dict[str, np.ndarray]:
        b, arrays = self.backend, {}
        for i, (R, W) in enumerate(zip(self.R_, self.W_, strict=True)):
            arrays[f"R_{i}"] = b.to_host(R)
            arrays[f"W_{i}"] = b.to_host(W[:, :classes_seen])
        return arrays

    def import_state(self, arrays: dict[str, np.ndarray], n_rows: int) -> None:
        b = self.backend
        for i, (R, W) in enumerate(zip(self.R_, self.W_, strict=True)):
            R[...] = b.asarray(arrays[f"R_{i}"], dtype=self.dtype)
            W_old = arrays[f"W_{i}"]
            W[:, : W_old.shape[1]] = b.asarray(W_old, dtype=self.dtype)
        self.n_rows_ = n_rows


def make_rls(
    method: str,
    backend: Backend,
    width: int,
    etas: tuple[float, ...],
    max_classes: int,
    dtype: Any = np.float64,
    expand: Expander | None = None,
) -> RidgeRLS:
    """The RLS state for `method` ('gram' or 'woodbury').

    `expand` (the solve's up-sampling) lets `gram` use the dual form on early
    steps; pass the input rows to `partial_fit` as X for that.
    """
    if method == "gram":
        return GramRLS(backend, width, etas, max_classes, dtype, expand=expand)
    if method == "woodbury":
        return WoodburyRLS(backend, width, etas, max_classes, dtype)
    raise PalError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
