"""Closed-form heads solved from one set of per-task sufficient statistics.

Every head here is a function of a `HeadStats` state accumulated from batches of
rows: H (n, E) up-sampled features, X (n, D) backbone features, y (n,) integer
labels. Statistics add, so two states merge by summing (AFL's absolute
aggregation is this sum), and W does not depend on batching or sharding.
All arithmetic is float64 in the NumPy/CuPy common subset; `xp` is the array
module (numpy by default).

Heads (source: the analytic-heads survey, sections 1.3, 1.4, 2 and 5):
- `ridge`: (G + eta I) W = Q by Cholesky (PAL/ACIL; RanPAC.py l.116-125).
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
  training row so far, refit after each batch as DS-AL's recursive update
  does, so the stream depends on the order of the batches (DS-AL's does too).
  Scores: H W_main + ratio * tanh(Z) W_comp (`dsal_scores`). Costs a second
  E x E and one E x E solve per batch.
- `ncm`: cosine similarity to class means in H space (SimpleCIL prototypes,
  LAMDA-PILOT simplecil.py, which scores cosine to prototypes).
- `lda`: shared covariance in X space = mean of class covariances (uniform
  priors), shrunk as (1 - a) S + a (tr S / D) I (sklearn's lsqr form with
  fixed shrinkage a); departs from FSA (total covariance + I). Keeps C x D x D.
- `val_sse` and `eta_path`: validation squared error of any W from a fold's
  (G_v, Q_v, |Y_v|^2), and the whole eta grid from one eigendecomposition.
- `eta_over_tasks`: the eta of a grid whose ridge (fitted without the folds)
  has the least squared error on the held-out folds of every task seen, from
  their kept statistics alone (no stored features). It scores squared error,
  where `solve.eta: auto` scores accuracy on the current task's rows.

Held-out fold: row with id i is held out when (i * 2654435761 + seed) mod
`fold` == 0, a deterministic choice from the seed and the row's id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

_HASH = 2654435761


def held_out(ids: Any, seed: int, fold: int, xp: Any = np) -> Any:
    """Boolean mask (n,) of rows in the held-out fold, from row ids and a seed."""
    ids = xp.asarray(ids).astype(xp.int64)
    return ((ids * _HASH + seed) % fold) == 0


@dataclass
class HeadStats:
    """Per-state sums. Shapes: G, Gv, Gair (E, E); Q, Qv, Qair (E, C);
    Hsum (C, E); Xsum (C, D); Sxx (C, D, D); n (C,); yv2 scalar."""

    E: int
    D: int
    C: int
    xp: Any = np
    seed: int = 0
    fold: int = 5
    G: Any = None
    Q: Any = None
    Gv: Any = None
    Qv: Any = None
    yv2: float = 0.0
    n: Any = None
    Hsum: Any = None
    Xsum: Any = None
    Sxx: Any = None
    Gair: Any = None
    Qair: Any = None
    done: set = field(default_factory=set)
    task_n: Any = None  # the current task's training rows per class
    dsal_eta: float | None = None  # DS-AL's main-stream eta; None: no stream
    Gc: Any = None  # DS-AL's compensation stream: tanh(Z)' tanh(Z)
    Qc: Any = None  # tanh(Z)' (residual of the main stream)

    def __post_init__(self) -> None:
        z = self.xp.zeros
        E, D, C = self.E, self.D, self.C
        self.G, self.Gv = z((E, E)), z((E, E))
        self.Q, self.Qv = z((E, C)), z((E, C))
        self.n = z(C)
        self.Hsum, self.Xsum, self.Sxx = z((C, E)), z((C, D)), z((C, D, D))
        self.Gair, self.Qair = z((E, E)), z((E, C))
        if self.dsal_eta is not None:
            self.Gc, self.Qc = z((E, E)), z((E, C))

    def begin_task(self, y: Any, ids: Any) -> None:
        """Count the task's training rows per class from all its labels and
        row ids (every shard's): AIR's weight 1/n_y of each row to come. A
        task still open is closed first (a shard's state, which holds part
        of the task's rows, is never checked complete: its merge is)."""
        xp = self.xp
        if self.task_n is not None:
            self.done |= {int(c) for c in xp.flatnonzero(self.task_n).tolist()}
        y = xp.asarray(y)
        for c in sorted(set(int(v) for v in y.tolist())):
            if c in self.done:
                raise ValueError(f"class {c} recurs after its task ended")
        t = ~held_out(ids, self.seed, self.fold, xp)
        self.task_n = xp.bincount(y[t], minlength=self.C).astype(xp.float64)

    def add(self, H: Any, X: Any, y: Any, ids: Any, Z: Any = None) -> None:
        """Accumulate one batch of rows of the current task (`begin_task`
        counted its labels); `Z`, the up-sampling's pre-activation (H =
        relu(Z)), when the state keeps DS-AL's stream."""
        xp = self.xp
        if self.task_n is None:
            raise ValueError("add: begin_task first (the task's labels counted)")
        H, X = xp.asarray(H, dtype=xp.float64), xp.asarray(X, dtype=xp.float64)
        y = xp.asarray(y)
        for c in sorted(set(int(v) for v in y.tolist())):
            if c in self.done:
                raise ValueError(f"class {c} recurs after its task ended")
            if self.task_n[c] == 0 and bool((y == c).any()):
                raise ValueError(f"class {c} was not counted by begin_task")
        Y = xp.zeros((len(y), self.C))
        Y[xp.arange(len(y)), y] = 1.0
        v = held_out(ids, self.seed, self.fold, xp)
        t = ~v
        Ht, Yt = H[t], Y[t]
        self.G += Ht.T @ Ht
        self.Q += Ht.T @ Yt
        self.Gv += H[v].T @ H[v]
        self.Qv += H[v].T @ Y[v]
        self.yv2 += float((Y[v] ** 2).sum())
        self.n += Yt.sum(0)
        self.Hsum += Yt.T @ Ht
        self.Xsum += Yt.T @ X[t]
        w = 1.0 / xp.maximum(self.task_n[y[t]], 1.0)  # AIR's 1/n_y per row
        self.Gair += (Ht * w[:, None]).T @ Ht
        self.Qair += Ht.T @ (Yt * w[:, None])
        for c in set(int(v) for v in y[t].tolist()):
            xc = X[t][y[t] == c]
            self.Sxx[c] += xc.T @ xc
        if self.dsal_eta is not None:
            if Z is None:
                raise ValueError("add: DS-AL's stream needs Z, the pre-activation")
            self._compensate(Ht, xp.asarray(Z, dtype=xp.float64)[t], Yt)

    def _compensate(self, Ht: Any, Zt: Any, Yt: Any) -> None:
        """DS-AL's step after the main stream took the batch: the residual
        of W_main on the batch, old classes' columns zeroed, into the
        compensation stream's sums."""
        xp = self.xp
        W = _chol_solve(self.G + self.dsal_eta * xp.eye(self.E), self.Q, xp)
        R = (Yt - Ht @ W) * (self.task_n > 0)[None, :]  # the current task's columns
        T = xp.tanh(Zt)
        self.Gc += T.T @ T
        self.Qc += T.T @ R

    def end_task(self) -> None:
        """Close the task: its classes may not recur. The rows added must be
        the ones `begin_task` counted (n_y final)."""
        if self.task_n is None:
            return
        for c in (int(c) for c in self.xp.flatnonzero(self.task_n).tolist()):
            if self.n[c] != self.task_n[c]:
                raise ValueError(
                    f"class {c}: {int(self.n[c])} training rows added, "
                    f"{int(self.task_n[c])} counted by begin_task"
                )
            self.done.add(c)
        self.task_n = None

    def merge(self, other: HeadStats) -> HeadStats:
        """Sum two states over disjoint rows (federated / sharded merge)."""
        out = HeadStats(self.E, self.D, self.C, self.xp, self.seed, self.fold)
        for k in ("G", "Q", "Gv", "Qv", "n", "Hsum", "Xsum", "Sxx", "Gair", "Qair"):
            setattr(out, k, getattr(self, k) + getattr(other, k))
        if self.dsal_eta is not None:  # sums of residuals each state took
            out.dsal_eta = self.dsal_eta
            out.Gc, out.Qc = self.Gc + other.Gc, self.Qc + other.Qc
        out.yv2 = self.yv2 + other.yv2
        out.done = self.done | other.done
        if self.task_n is not None and other.task_n is not None:
            if bool((self.task_n != other.task_n).any()):
                raise ValueError("merge: the states counted different tasks")
        out.task_n = self.task_n if self.task_n is not None else other.task_n
        return out


def _chol_solve(A: Any, B: Any, xp: Any) -> Any:
    L = xp.linalg.cholesky(A)
    return xp.linalg.solve(L.T, xp.linalg.solve(L, B))


def ridge(s: HeadStats, eta: float) -> Any:
    """Joint ridge W (E, C): (G + eta I) W = Q (PAL/ACIL)."""
    xp = s.xp
    return _chol_solve(s.G + eta * xp.eye(s.E), s.Q, xp)


def air(s: HeadStats, eta: float) -> Any:
    """AIR class-balanced ridge W (E, C) in one E x E, seen classes only."""
    xp = s.xp
    seen = [int(c) for c in xp.flatnonzero(s.n).tolist()]
    inv = sum(1.0 / float(s.n[c]) for c in seen)
    scale = len(seen) / inv
    return _chol_solve(s.Gair + (eta / scale) * xp.eye(s.E), s.Qair, xp)


def dsal(s: HeadStats, eta: float) -> Any:
    """DS-AL's compensation W (E, C): (Gc + eta I) W = Qc."""
    if s.Gc is None:
        raise ValueError("dsal: the state keeps no DS-AL stream (dsal_eta)")
    return _chol_solve(s.Gc + eta * s.xp.eye(s.E), s.Qc, s.xp)


def dsal_scores(
    H: Any, Z: Any, W_main: Any, W_comp: Any, ratio: float, xp: Any = np
) -> Any:
    """DS-AL's output: the main stream plus `ratio` times the compensation."""
    return H @ W_main + ratio * (xp.tanh(Z) @ W_comp)


def ncm(s: HeadStats, H: Any) -> Any:
    """Cosine scores (n, C) of rows H (n, E) against class means."""
    xp = s.xp
    mu = s.Hsum / xp.maximum(s.n, 1.0)[:, None]
    mu = mu / xp.maximum(xp.linalg.norm(mu, axis=1), 1e-300)[:, None]
    Hn = H / xp.maximum(xp.linalg.norm(H, axis=1), 1e-300)[:, None]
    return Hn @ mu.T


def lda(s: HeadStats, shrinkage: float) -> tuple[Any, Any]:
    """LDA (coef (C, D), intercept (C,)) with shared shrunk covariance, uniform priors.

    S = (1/C) sum_y (Sxx_y / n_y - mu_y mu_y^T) (sklearn's prior-weighted class
    covariances, uniform priors), S_a = (1 - a) S + a tr(S)/D I;
    coef = mu S_a^-1, intercept = -1/2 diag(mu S_a^-1 mu^T) + log(1/C).
    """
    xp = s.xp
    mu = s.Xsum / s.n[:, None]
    S = (s.Sxx / s.n[:, None, None]).mean(0) - (mu.T @ mu) / s.C
    Sa = (1 - shrinkage) * S + shrinkage * xp.trace(S) / s.D * xp.eye(s.D)
    coef = _chol_solve(Sa, mu.T, xp).T
    icpt = -0.5 * (coef * mu).sum(1) + np.log(1.0 / s.C)
    return coef, icpt


def val_sse(s: HeadStats, W: Any) -> float:
    """Held-out squared error |Y_v - H_v W|^2 = |Y_v|^2 - 2<W,Q_v> + <W,G_v W>."""
    return float(s.yv2 - 2 * (W * s.Qv).sum() + (W * (s.Gv @ W)).sum())


def eta_over_tasks(s: HeadStats, etas: list[float]) -> tuple[float, list[float]]:
    """The eta of `etas` with the least held-out squared error over every
    task's fold, and each eta's error (ties: the first)."""
    errors = [val_sse(s, W) for W in eta_path(s, etas)]
    best = min(range(len(etas)), key=lambda i: errors[i])
    return etas[best], errors


def eta_path(s: HeadStats, etas: list[float]) -> list[Any]:
    """Ridge W for every eta from one eigendecomposition G = V diag(lam) V^T."""
    xp = s.xp
    lam, V = xp.linalg.eigh(s.G)
    VQ = V.T @ s.Q
    return [V @ (VQ / (lam + e)[:, None]) for e in etas]
