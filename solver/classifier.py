"""The analytic classifier of one weights file: logits for features.

`Classifier(path)` reads a weights file written by `solve` and regenerates its
up-sampling from the file's own attrs (DESIGN §4), so that

    logits = max(X W_up, 0) W_k

for the features X of step k's embedding. The evaluate stage scores with it
and `pal predict` ranks classes with it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from solver.backend import Backend, get_backend
from solver.rls import Expander, make_expander
from solver.weights import WeightsFile, WeightsInfo


class Classifier:
    """W_k of every step of a weights file, with the up-sampling it was
    solved with.

    `partial`: accept a file that holds only the later steps (solved from a
    state, `first_step` > 1). `backend`: where H and the logits are computed
    (default: NumPy).
    """

    def __init__(
        self,
        path: str | Path,
        backend: Backend | None = None,
        partial: bool = False,
    ) -> None:
        self.weights = WeightsFile(path, partial=partial)
        self.backend = backend or get_backend("cpu")

    @functools.cached_property
    def expand(self) -> Expander:
        """X (r, D) host rows -> H = max(X W_up, 0) (r, width) on the backend;
        built on first use (an η sweep's files share one)."""
        i = self.info
        return make_expander(self.backend, i.feature_dim, i.width, i.seed, i.dtype)

    @property
    def path(self) -> Path:
        return self.weights.path

    @property
    def info(self) -> WeightsInfo:
        """width, seed, feature_dim, method, dtype and η (0 for auto)."""
        return self.weights.info

    @property
    def first_step(self) -> int:
        return self.weights.first_step

    @property
    def n_steps(self) -> int:
        return self.weights.n_steps

    @property
    def eta_by_step(self) -> list[float] | None:
        """`solve.eta: auto`: the η chosen for each step; None otherwise."""
        return self.weights.eta_by_step

    @property
    def classes_seen(self) -> list[int]:
        """C_k of step k at index k - 1 (0 before `first_step`)."""
        return self.weights.classes_seen

    def W(self, step: int) -> np.ndarray:
        """W_step: (width, classes_seen) in the stored dtype, on the host."""
        return self.weights.W(step)

    def logits(self, X: np.ndarray, step: int, W: Any = None) -> np.ndarray:
        """max(X W_up, 0) W_step: (n, C_step) in the solver dtype, on the host,
        for X (n, feature_dim) float32/float16; `W`: W_step already read."""
        W = self.backend.asarray(self.W(step) if W is None else W)
        return self.backend.to_host(self.expand(X) @ W)
