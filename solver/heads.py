"""Closed-form heads solved from one set of per-task sufficient statistics.

Every head here is a function of a `HeadStats` state accumulated from batches of
rows: H (n, E) up-sampled features, X (n, D) backbone features, y (n,) integer
labels. Statistics add, so two states merge by summing (AFL's absolute
aggregation is this sum), and W does not depend on batching or sharding.
All arithmetic is float64 in the NumPy/CuPy common subset; `xp` is the array
module (numpy by default). A state keeps only the sums its `heads` need.
On NumPy the E x E sums (G, G_v, AIR's, DS-AL's) are Fortran-ordered and
only their lower triangle is kept: each batch enters by one in-place SYRK
(half a GEMM's FLOPs, no E x E temporary), and every reader reads the lower
triangle (a Cholesky, `symm`). On CuPy they are whole.

Heads (source: the analytic-heads survey, sections 1.3, 1.4, 2 and 5), each
fitted on every training row:
- `ridge`: (G + eta I) W = Q by Cholesky (PAL/ACIL; RanPAC.py l.116-125): the
  weights the solve stage writes to weights.h5, from the same sums.
- `ridge_all`: the joint ridge with eta chosen after each task by
  `eta_over_tasks` (below), then fitted on every row.
- `air`: (sum_y G_y/n_y + (eta/s) I)^-1 sum_y Q_y/n_y, s = C / sum_y 1/n_y
  (AIR, AnalyticLinear.py GeneralizedARM, in one E x E instead of C of them).
  Assumes disjoint classes: n_y is final when y's task ends; a class that
  recurs in a later task is refused. A task starts with its labels counted
  (`begin_task`: the labels alone, a cheap first read), so each row enters
  AIR's sums weighted by 1/n_y at once: one E x E, never one per class.
- `dsal`: DS-AL's compensation stream (AAAI 2024, analytic/DSAL.py l.60-80):
  a ridge on tanh of the up-sampling's pre-activation Z, fitted to the main
  stream's residual Y - H W_main with the columns of classes outside the
  current task zeroed; W_main is the joint ridge (eta `dsal_eta`) on every
  row so far, refit after each batch as DS-AL's recursive update does, so the
  stream depends on the order of the batches (DS-AL's does too). Scores:
  H W_main + ratio * tanh(Z) W_comp (`dsal_scores`). Costs a second E x E
  and one E x E solve per batch.
- `ncm`: cosine similarity to class means in H space (SimpleCIL prototypes,
  LAMDA-PILOT simplecil.py, which scores cosine to prototypes).
- `lda`: shared covariance in X space = mean of the seen classes' covariances
  (uniform priors), shrunk as (1 - a) S + a (tr S / D) I (sklearn's lsqr
  form with fixed shrinkage a); departs from FSA (total covariance + I).
  The class covariances enter one D x D sum, each row weighted by 1/n_y as
  AIR's rows are.
- `val_sse` and `eta_path`: squared error on the held-out fold of any W from
  the fold's (G_v, Q_v, |Y_v|^2), and the ridge of every eta of a grid
  fitted on the Gram without the fold.
- `eta_over_tasks`: the eta of a grid whose ridge, fitted without the folds,
  has the least squared error on the held-out folds of every task seen, from
  their kept statistics alone (no stored features). It scores squared error,
  where `solve.eta: auto` scores accuracy on the current task's rows.

Held-out fold: the row with id i is held out when (i * 2654435761 + seed)
mod 2^32 < holdout * 2^32, a deterministic choice from the seed and the
row's id (the solve stage's ids: a row's index among its task's rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.linalg

HEADS = ("ridge", "ridge_all", "air", "dsal", "ncm", "lda")
_HASH = 2654435761
_SUMS = {  # the sums each head needs beyond G, Q and the class counts
    "ridge": (),
    "ridge_all": ("Gv", "Qv"),
    "air": ("Gair", "Qair"),
    "dsal": ("Gc", "Qc"),
    "ncm": ("Hsum",),
    "lda": ("Xsum", "Sw"),
}


def head_bytes(E: int, D: int, C: int, head: str) -> int:
    """Bytes of the float64 sums a head keeps beyond the joint ridge's G, Q
    and the class counts (which every head shares)."""
    size = {"Gv": E * E, "Qv": E * C, "Gair": E * E, "Qair": E * C, "Gc": E * E,
            "Qc": E * C, "Hsum": C * E, "Xsum": C * D, "Sw": D * D}  # fmt: skip
    return 8 * sum(size[k] for k in _SUMS[head])


def held_out(ids: Any, seed: int, holdout: float, xp: Any = np) -> Any:
    """Boolean mask (n,) of rows in the held-out fold, from row ids and a seed."""
    ids = xp.asarray(ids).astype(xp.int64)
    return ((ids * _HASH + seed) % 2**32) < int(holdout * 2**32)


@dataclass
class HeadStats:
    """Per-state sums over every row, kept for the heads asked. Shapes: G,
    Gv, Gair, Gc (E, E); Q, Qv, Qair, Qc (E, C); Hsum (C, E); Xsum (C, D);
    Sw (D, D); n (C,); yv2 scalar (the fold's |Y_v|^2)."""

    E: int
    D: int
    C: int
    xp: Any = np
    seed: int = 0
    holdout: float = 0.2
    heads: tuple[str, ...] = HEADS
    dsal_eta: float = 1.0  # DS-AL's main-stream eta
    own_gram: bool = True  # False: G and Q are lent (`lend_gram`), not summed here
    yv2: float = 0.0
    sums: dict[str, Any] = field(default_factory=dict)
    done: set = field(default_factory=set)
    task_n: Any = None  # the current task's rows per class
    dsal_main: Any = None  # DS-AL's main-stream W after the latest batch

    def __post_init__(self) -> None:
        unknown = [h for h in self.heads if h not in _SUMS]
        if unknown:
            raise ValueError(f"unknown head {unknown[0]!r}: one of {', '.join(HEADS)}")
        E, D, C = self.E, self.D, self.C
        shapes = {
            "G": (E, E), "Q": (E, C), "n": (C,), "Gv": (E, E), "Qv": (E, C),
            "Gair": (E, E), "Qair": (E, C), "Gc": (E, E), "Qc": (E, C),
            "Hsum": (C, E), "Xsum": (C, D), "Sw": (D, D),
        }  # fmt: skip
        keep = ["G", "Q"] if self.own_gram else []
        keep += ["n"] + [k for h in self.heads for k in _SUMS[h]]
        if not self.sums:
            self.sums = {k: self._zeros(shapes[k]) for k in dict.fromkeys(keep)}

    def _zeros(self, shape: tuple[int, ...]) -> Any:
        square = len(shape) == 2 and shape[0] == shape[1] == self.E
        if square and self.xp is np:  # the lower triangle, for `_sym_add`
            return np.zeros(shape, order="F")
        return self.xp.zeros(shape)

    def __getattr__(self, name: str) -> Any:
        sums = self.__dict__.get("sums", {})
        if name in sums:
            return sums[name]
        raise AttributeError(name)

    def nbytes(self) -> int:
        """Bytes of the sums this state keeps (lent G and Q not counted)."""
        lent = () if self.own_gram else ("G", "Q")
        return int(sum(a.nbytes for k, a in self.sums.items() if k not in lent))

    def lend_gram(self, G: Any, Q: Any) -> None:
        """G (E, E) and Q (E, C) of every row added so far, kept elsewhere
        (the solve's own sums): a state with `own_gram` False reads them."""
        self.sums["G"], self.sums["Q"] = G, Q

    def _has(self, key: str) -> bool:
        return key in self.sums

    def begin_task(self, y: Any) -> None:
        """Count the task's rows per class from all its labels (every
        shard's): AIR's and LDA's weight 1/n_y of each row to come. A task
        still open is closed first (a shard's state, which holds part of
        the task's rows, is never checked complete: its merge is)."""
        xp = self.xp
        if self.task_n is not None:
            self.done |= {int(c) for c in xp.flatnonzero(self.task_n).tolist()}
        y = xp.asarray(y)
        for c in sorted(set(int(v) for v in y.tolist())):
            if c in self.done:
                raise ValueError(f"class {c} recurs after its task ended")
        self.task_n = xp.bincount(y, minlength=self.C).astype(xp.float64)

    def add(self, H: Any, X: Any, y: Any, ids: Any, Z: Any = None) -> None:
        """Accumulate one batch of rows of the current task (`begin_task`
        counted its labels); `Z`, the up-sampling's pre-activation (H =
        relu(Z)), when the state keeps DS-AL's stream."""
        xp = self.xp
        if self.task_n is None:
            raise ValueError("add: begin_task first (the task's labels counted)")
        H, X = xp.asarray(H, dtype=xp.float64), xp.asarray(X, dtype=xp.float64)
        y = xp.asarray(y)
        self._check_labels(y)
        Y = xp.zeros((len(y), self.C))
        Y[xp.arange(len(y)), y] = 1.0
        s = self.sums
        if self.own_gram:
            _sym_add(s["G"], H, xp)
            s["Q"] += H.T @ Y
        s["n"] += Y.sum(0)
        w = 1.0 / xp.maximum(self.task_n[y], 1.0)  # 1/n_y per row
        if self._has("Gv"):
            v = held_out(ids, self.seed, self.holdout, xp)
            _sym_add(s["Gv"], H[v], xp)
            s["Qv"] += H[v].T @ Y[v]
            self.yv2 += float((Y[v] ** 2).sum())
        if self._has("Gair"):  # (sqrt(w) H)' (sqrt(w) H): one symmetric product
            _sym_add(s["Gair"], H * xp.sqrt(w)[:, None], xp)
            s["Qair"] += H.T @ (Y * w[:, None])
        if self._has("Hsum"):
            s["Hsum"] += Y.T @ H
        if self._has("Xsum"):
            s["Xsum"] += Y.T @ X
            Xw = X * xp.sqrt(w)[:, None]  # one symmetric product, as AIR's
            s["Sw"] += Xw.T @ Xw
        if self._has("Gc"):
            if Z is None:
                raise ValueError("add: DS-AL's stream needs Z, the pre-activation")
            self._compensate(H, xp.asarray(Z, dtype=xp.float64), Y)

    def _check_labels(self, y: Any) -> None:
        for c in sorted(set(int(v) for v in y.tolist())):
            if c in self.done:
                raise ValueError(f"class {c} recurs after its task ended")
            if self.task_n[c] == 0:
                raise ValueError(f"class {c} was not counted by begin_task")

    def _compensate(self, H: Any, Z: Any, Y: Any) -> None:
        """DS-AL's step after the main stream took the batch: the residual
        of W_main on the batch, old classes' columns zeroed, into the
        compensation stream's sums."""
        xp = self.xp
        W = self.dsal_main = _ridge_solve(self.G, self.dsal_eta, self.Q, xp)
        R = (Y - H @ W) * (self.task_n > 0)[None, :]  # the current task's columns
        T = xp.tanh(Z)
        _sym_add(self.sums["Gc"], T, xp)
        self.sums["Qc"] += T.T @ R

    def end_task(self) -> None:
        """Close the task: its classes may not recur. The rows added must be
        the ones `begin_task` counted (n_y final)."""
        if self.task_n is None:
            return
        for c in (int(c) for c in self.xp.flatnonzero(self.task_n).tolist()):
            if self.n[c] != self.task_n[c]:
                raise ValueError(
                    f"class {c}: {int(self.n[c])} rows added, "
                    f"{int(self.task_n[c])} counted by begin_task"
                )
            self.done.add(c)
        self.task_n = None

    def merge(self, other: HeadStats) -> HeadStats:
        """Sum two states over disjoint rows (federated / sharded merge).
        DS-AL's sums are the sums of the residuals each state took."""
        if self.heads != other.heads:
            raise ValueError("merge: the states keep different heads")
        sums = {k: a + other.sums[k] for k, a in self.sums.items()}
        if not (self.own_gram and other.own_gram):
            raise ValueError("merge: a state whose G and Q are lent")
        out = HeadStats(
            self.E, self.D, self.C, self.xp, self.seed, self.holdout, self.heads,
            self.dsal_eta, True, self.yv2 + other.yv2, sums, self.done | other.done,
        )  # fmt: skip
        if self.task_n is not None and other.task_n is not None:
            if bool((self.task_n != other.task_n).any()):
                raise ValueError("merge: the states counted different tasks")
        out.task_n = self.task_n if self.task_n is not None else other.task_n
        return out


def _sym_add(M: Any, A: Any, xp: Any) -> None:
    """M += A'A for A (r, E): in place on M's lower triangle on NumPy (one
    SYRK on the Fortran-ordered M), the whole product on CuPy."""
    if xp is not np:
        M += A.T @ A
        return
    syrk = scipy.linalg.blas.get_blas_funcs("syrk", (M,))
    out = syrk(1.0, A.T, beta=1.0, c=M, trans=0, lower=1, overwrite_c=1)
    if not np.shares_memory(out, M):  # a layout the in-place kernel refused
        raise AssertionError("_sym_add: M must be a Fortran-ordered float64")


def _sym_matmul(A: Any, B: Any, xp: Any) -> Any:
    """A B for A symmetric: its lower triangle read on NumPy (`symm`)."""
    if xp is not np:
        return A @ B
    symm = scipy.linalg.blas.get_blas_funcs("symm", (A, B))
    return symm(1.0, A, B, side=0, lower=1)


def _chol_solve(A: Any, B: Any, xp: Any) -> Any:
    """A^-1 B for A symmetric positive definite: a Cholesky factor and two
    triangular solves (a general solve of each factor costs 4x as much)."""
    if xp is np:
        factor = scipy.linalg.cho_factor(A, lower=True, check_finite=False)
        return scipy.linalg.cho_solve(factor, B, check_finite=False)
    from cupyx.scipy.linalg import solve_triangular  # the CuPy backend's

    L = xp.linalg.cholesky(A)
    return solve_triangular(L.T, solve_triangular(L, B, lower=True), lower=False)


def _ridge_solve(A: Any, eta: float, B: Any, xp: Any) -> Any:
    """(A + eta I)^-1 B for A symmetric positive semi-definite, with one
    E x E copy of A (no identity matrix, no second copy for the factor).
    On NumPy only A's lower triangle is read."""
    M = np.array(A, order="F") if xp is np else A.copy()
    idx = xp.arange(M.shape[0])
    M[idx, idx] += eta
    if xp is np:
        factor = scipy.linalg.cho_factor(
            M, lower=True, overwrite_a=True, check_finite=False
        )
        return scipy.linalg.cho_solve(factor, B, check_finite=False)
    return _chol_solve(M, B, xp)


def _seen(s: HeadStats) -> list[int]:
    return [int(c) for c in s.xp.flatnonzero(s.n).tolist()]


def ridge(s: HeadStats, eta: float) -> Any:
    """Joint ridge W (E, C): (G + eta I) W = Q (PAL/ACIL)."""
    xp = s.xp
    return _ridge_solve(s.G, eta, s.Q, xp)


def air(s: HeadStats, eta: float) -> Any:
    """AIR class-balanced ridge W (E, C) in one E x E, seen classes only."""
    xp = s.xp
    seen = _seen(s)
    inv = sum(1.0 / float(s.n[c]) for c in seen)
    scale = len(seen) / inv
    return _ridge_solve(s.Gair, eta / scale, s.Qair, xp)


def dsal(s: HeadStats, eta: float) -> Any:
    """DS-AL's compensation W (E, C): (Gc + eta I) W = Qc."""
    if "Gc" not in s.sums:
        raise ValueError("dsal: the state keeps no DS-AL stream")
    return _ridge_solve(s.Gc, eta, s.Qc, s.xp)


def dsal_scores(
    H: Any, Z: Any, W_main: Any, W_comp: Any, ratio: float, xp: Any = np
) -> Any:
    """DS-AL's output: the main stream plus `ratio` times the compensation."""
    return H @ W_main + ratio * (xp.tanh(Z) @ W_comp)


def class_means(s: HeadStats) -> Any:
    """Unit-norm class means (C, E) in H space (zero rows for unseen classes)."""
    xp = s.xp
    mu = s.Hsum / xp.maximum(s.n, 1.0)[:, None]
    return mu / xp.maximum(xp.linalg.norm(mu, axis=1), 1e-300)[:, None]


def ncm(s: HeadStats, H: Any) -> Any:
    """Cosine scores (n, C) of rows H (n, E) against class means."""
    return ncm_scores(H, class_means(s), s.xp)


def ncm_scores(H: Any, means: Any, xp: Any = np) -> Any:
    """Cosine of each row of H to each unit-norm class mean."""
    Hn = H / xp.maximum(xp.linalg.norm(H, axis=1), 1e-300)[:, None]
    return Hn @ means.T


def lda(s: HeadStats, shrinkage: float) -> tuple[Any, Any]:
    """LDA (coef (C, D), intercept (C,)) over the seen classes, with a shared
    shrunk covariance and uniform priors; unseen classes score -inf.

    S = (1/C) sum_y (Sxx_y / n_y - mu_y mu_y^T) over the C seen classes
    (sklearn's prior-weighted class covariances, uniform priors),
    S_a = (1 - a) S + a tr(S)/D I; coef = mu S_a^-1,
    intercept = -1/2 diag(mu S_a^-1 mu^T) + log(1/C).
    """
    xp = s.xp
    seen = _seen(s)
    C = len(seen)
    mu = s.Xsum[seen] / s.n[seen][:, None]
    S = (s.Sw - mu.T @ mu) / C
    Sa = (1 - shrinkage) * S + shrinkage * xp.trace(S) / s.D * xp.eye(s.D)
    coef = xp.zeros((s.C, s.D))
    icpt = xp.full(s.C, -xp.inf)
    coef[seen] = _chol_solve(Sa, mu.T, xp).T
    icpt[seen] = -0.5 * (coef[seen] * mu).sum(1) + np.log(1.0 / C)
    return coef, icpt


def val_sse(s: HeadStats, W: Any) -> float:
    """Held-out squared error |Y_v - H_v W|^2 = |Y_v|^2 - 2<W,Q_v> + <W,G_v W>."""
    GvW = _sym_matmul(s.Gv, W, s.xp)
    return float(s.yv2 - 2 * (W * s.Qv).sum() + (W * GvW).sum())


def eta_over_tasks(s: HeadStats, etas: list[float]) -> tuple[float, list[float]]:
    """The eta of `etas` with the least held-out squared error over every
    task's fold, and each eta's error (ties: the first)."""
    errors = [val_sse(s, W) for W in eta_path(s, etas)]
    best = min(range(len(etas)), key=lambda i: errors[i])
    return etas[best], errors


def eta_path(s: HeadStats, etas: list[float]) -> list[Any]:
    """The ridge W fitted without the held-out rows, for every eta: one
    Cholesky of G - G_v + eta I each. (One eigendecomposition would serve
    the whole grid, but costs 2.4x a Cholesky at E = 1,000 and 5.9x at
    3,000 on the 2-core CPU, growing with E: a grid of 5 is cheaper so.)"""
    xp = s.xp
    G, Q = s.G - s.Gv, s.Q - s.Qv
    return [_ridge_solve(G, e, Q, xp) for e in etas]


def solve_flops(
    E: int,
    n: int,
    D: int,
    C: int,
    steps: int,
    chunk: int,
    grid: int = 5,
    auto: bool = False,
) -> dict[str, float]:
    """A FLOP model: the plain solve's (up-sampling GEMM, SYRK, Q and a
    factorisation per step) and what each head adds beside it (its sums,
    and its factorisations: DS-AL one per chunk, a step's n / steps rows
    read `chunk` rows at a time, its last chunk partial). n rows, E width,
    D features, C classes, a 20 % fold. The η path (the fold's SYRK and a
    factorisation per η of a `grid` and step) is the solve's with `auto`
    (`solve.eta: auto`), and ridge_all then adds only its refit; beside a
    fixed η, ridge_all pays for the path."""
    chol = E**3 / 3 + 2 * E * E * C  # one factorisation and its solves
    path = 0.2 * n * E * E + steps * grid * chol
    solve = 2 * n * D * E + n * E * E + 2 * n * E * C + steps * chol
    return {
        "solve": solve + (path if auto else 0.0),
        "ridge": 0.0,  # the solve's own W
        "ridge_all": steps * chol + (0.0 if auto else path),
        "air": n * E * E + steps * chol,
        "dsal": n * E * E + steps * -(-n // (steps * chunk)) * chol + steps * chol,
        "ncm": 2 * n * E * C,
        "lda": 2 * n * D * D + 2 * n * D * C + steps * D**3 / 3,
    }
