"""The η rules: `solve.eta: auto` (current task) and head `ridge_all` (every task).

In the exemplar-free spirit, no old data is kept: a seeded share
`solve.holdout` of every task's training rows is its held-out fold (the row
with id i, its index among the task's rows, is held out when
(i · 2654435761 + seed) mod 2³² < holdout · 2³², `solver.heads.held_out`).
The pass over a step's shard absorbs every row into G and Q as usual and,
besides, the fold's rows into G_v = H_vᵀH_v, Q_v = H_vᵀY_v and ‖Y_v‖², summed
over every task so far. After each step, for each η of `solve.eta_grid`

    W_η = (G − G_v + ηI)⁻¹ (Q − Q_v)        (fitted without every fold)

is solved once, and both rules read the same W_η:

- the current-task rule (`eta: auto`) scores accuracy (argmax over the C_k
  classes seen) on the current task's fold rows, kept for the step; the most
  accurate η (ties: the larger) is kept for step k and W_k is solved with it
  from G and Q, i.e. refitted on every row;
- the all-task rule (head `ridge_all`) scores the squared error on every
  task's fold from the sums alone, ‖Y_v‖² − 2⟨W, Q_v⟩ + ⟨W, G_v W⟩; the least
  error (ties: the first) is its η.

Cost per step: one SYRK over the fold's rows and one d×d Cholesky per η of
the grid, shared by the two rules; memory: one more d×d matrix.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from solver.backend import Backend
from solver.heads import held_out
from solver.rls import Expander, GramRLS, one_hot

log = logging.getLogger(__name__)


class EtaSelector:
    """The held-out folds' statistics and the η each rule chooses."""

    def __init__(
        self,
        backend: Backend,
        width: int,
        max_classes: int,
        dtype: Any,
        grid: tuple[float, ...],
        holdout: float,
        seed: int,
        keep_rows: bool = True,
    ) -> None:
        self.backend, self.xp = backend, backend.xp
        self.dtype = np.dtype(dtype)
        self.grid, self.holdout, self.seed = tuple(grid), holdout, seed
        self.keep_rows = keep_rows  # the current-task rule scores the rows
        self.G_v = backend.sym_empty(width, self.dtype)  # (d, d), lower triangle
        self.Q_v = self.xp.zeros((width, max_classes), dtype=self.dtype)
        self.yv2 = 0.0  # ‖Y_v‖²: one per held-out row (one-hot targets)
        self._X: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        self._offset = 0

    def start_step(self) -> None:
        """A new task: its rows' ids count from 0; its fold rows are new."""
        self._offset = 0
        self._X, self._y = [], []

    def absorb(self, H: Any, X: np.ndarray, labels: np.ndarray) -> None:
        """Note the fold rows of the next chunk: H (r, d), X (r, D) and
        labels (r,) of the rows in stream order."""
        r = len(labels)
        held = held_out(
            np.arange(self._offset, self._offset + r), self.seed, self.holdout
        )
        self._offset += r
        if not held.any():
            return
        b = self.backend
        H_v = H[b.asarray(held)]
        b.syrk_(self.G_v, H_v.T)  # G_v += H_vᵀH_v
        y = labels[held]
        lo, hi = int(y.min()), int(y.max()) + 1
        Y = one_hot(b.asarray(y - lo), hi - lo, self.xp, self.dtype)
        self.Q_v[:, lo:hi] += H_v.T @ Y
        self.yv2 += float(len(y))
        if self.keep_rows:
            self._X.append(X[held])
            self._y.append(y)

    def path(self, rls: GramRLS, classes_seen: int) -> list[Any]:
        """W_η (d, C_k) of every η of the grid, fitted without the folds;
        [] while no row has been held out."""
        if self.yv2 == 0:
            return []
        return [
            rls.weights_without(self.G_v, self.Q_v, e, classes_seen) for e in self.grid
        ]

    def current_task(
        self, path: list[Any], expand: Expander
    ) -> tuple[float, list[float]]:
        """The η of the grid most accurate on the current task's fold rows,
        and each candidate's accuracy (%); with no rows held out, 1.0 and []."""
        if not self._y or not path:
            log.warning("solve: eta auto: no held-out rows in this step; eta 1")
            return 1.0, []
        H_v = expand(np.concatenate(self._X))
        y = self.backend.asarray(np.concatenate(self._y))
        accs = []
        for W in path:
            hits = self.xp.argmax(H_v @ W, axis=1) == y
            accs.append(100.0 * float(hits.mean()))
        best = max(range(len(self.grid)), key=lambda i: (accs[i], self.grid[i]))
        return self.grid[best], accs

    def over_tasks(self, path: list[Any]) -> tuple[float, list[float]]:
        """The η of the grid with the least squared error on every task's
        fold, and each candidate's error; with no fold yet, 1.0 and []."""
        if not path:
            return 1.0, []
        k = path[0].shape[1]
        Q_v = self.Q_v[:, :k]
        errors = [
            float(
                self.yv2
                - 2 * (W * Q_v).sum()
                + (W * self.backend.symm(self.G_v, W)).sum()
            )
            for W in path
        ]
        best = min(range(len(self.grid)), key=lambda i: errors[i])
        return self.grid[best], errors
