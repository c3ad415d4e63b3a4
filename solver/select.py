"""η from held-out rows of the current task: `solve.eta: auto`.

In the exemplar-free spirit, no old data is needed: at step k a seeded share
`solve.holdout` of task k's training rows is held out. The pass over the
step's shard absorbs every row into G and Q as usual and, besides, the held
out rows into G_v = H_vᵀH_v and Q_v = H_vᵀY_v. Then for each η of
`solve.eta_grid`

    W_η = (G − G_v + ηI)⁻¹ (Q − Q_v)        (fitted without the held-out rows)

is scored on the held-out rows (argmax over the C_k classes seen); the most
accurate η (ties: the larger) is kept for step k, and W_k is solved with it
from G and Q, i.e. refitted on all of the step's rows. Cost per step: one
extra SYRK over the held-out rows and one d×d Cholesky per candidate η; memory:
one more d×d matrix.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from solver.backend import Backend
from solver.rls import Expander, GramRLS, one_hot

log = logging.getLogger(__name__)


class EtaSelector:
    """Held-out statistics of the current step and the choice of η."""

    def __init__(
        self,
        backend: Backend,
        width: int,
        max_classes: int,
        dtype: Any,
        grid: tuple[float, ...],
        holdout: float,
        seed: int,
    ) -> None:
        self.backend, self.xp = backend, backend.xp
        self.dtype = np.dtype(dtype)
        self.grid, self.holdout, self.seed = tuple(grid), holdout, seed
        self.G_v = backend.sym_empty(width, self.dtype)  # (d, d), lower triangle
        self.Q_v = self.xp.zeros((width, max_classes), dtype=self.dtype)
        self._X: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        self._mask = np.zeros(0, dtype=bool)
        self._offset = 0

    def start_step(self, step: int, n_rows: int) -> None:
        """Draw the step's held-out rows (seeded by `seed` and `step`)."""
        rng = np.random.default_rng([self.seed, step])
        self._mask = rng.random(n_rows) < self.holdout
        self._offset = 0
        self.G_v[...] = 0
        self.Q_v[...] = 0
        self._X, self._y = [], []

    def absorb(self, H: Any, X: np.ndarray, labels: np.ndarray) -> None:
        """Note the held-out rows of the next chunk: H (r, d), X (r, D) and
        labels (r,) of the rows in stream order."""
        r = len(labels)
        held = self._mask[self._offset : self._offset + r]
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
        self._X.append(X[held])
        self._y.append(y)

    def choose(
        self, rls: GramRLS, classes_seen: int, expand: Expander
    ) -> tuple[float, list[float]]:
        """The η of the grid that scores best on the held-out rows, and each
        candidate's held-out accuracy (%); with no rows held out, 1.0 and []."""
        if not self._y:
            log.warning("solve: eta auto: no held-out rows in this step; eta 1")
            return 1.0, []
        H_v = expand(np.concatenate(self._X))
        y = self.backend.asarray(np.concatenate(self._y))
        accs = []
        for eta in self.grid:
            W = rls.weights_without(self.G_v, self.Q_v, eta, classes_seen)
            hits = self.xp.argmax(H_v @ W, axis=1) == y
            accs.append(100.0 * float(hits.mean()))
        best = max(range(len(self.grid)), key=lambda i: (accs[i], self.grid[i]))
        return self.grid[best], accs
