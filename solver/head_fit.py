"""The solve stage's closed-form heads (`solve.heads`): fitted from the pass
that fits weights.h5 and written to `heads.h5` beside it.

Each step's rows enter one `solver.heads.HeadStats` (its labels counted
first, a read of the labels alone); at the step's end every head asked is
solved from the sums and its arrays are kept for the file. A head's η is the
one weights.h5 holds for the step (the chosen η with `solve.eta: auto`, the
first of a sweep); `ridge_all` chooses its own from `solve.eta_grid` on the
held-out folds of every task so far; `dsal` keeps the η its residuals were
taken at, batch by batch (`solve.eta`; 1 under `auto`, whose η is chosen only
at the step's end), and its main stream is the W of the step's last batch.
Beside `solve.method: gram` ridge_all's choice reads the η path
`solver.select` fits for `eta: auto` too (one Cholesky per η and step serves
both rules); beside woodbury the heads keep their own folds
(`solver.heads.eta_over_tasks`).

heads.h5: attrs `heads` (JSON list), width, seed, dtype, feature_dim,
dsal_ratio, lda_shrinkage, holdout, eta_grid (JSON), state_bytes; one group
`step_XX` per step (attrs classes_seen, eta) holding `<head>/<array>`:
ridge/W, ridge_all/W (attrs eta, sse: the grid's held-out squared errors),
air/W, dsal/W_main and dsal/W_comp (attr eta), ncm/means, lda/coef and
lda/intercept;
W (width, C_k), means (C_k, width), coef (C_k, D), intercept (C_k,).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from palcore.outputs import atomic_path
from solver import heads as hd
from solver.backend import Backend
from solver.params import SolveParams
from solver.rls import GramRLS, RidgeRLS

log = logging.getLogger(__name__)

HEADS_FILE = "heads.h5"


class HeadsFit:
    """The heads' statistics of one chain, and each step's solved arrays."""

    def __init__(
        self,
        params: SolveParams,
        backend: Backend,
        feature_dim: int,
        classes: int,
        rls: RidgeRLS | None = None,
        shares_fold: bool = False,
    ) -> None:
        self.params = params
        self.backend = backend
        # the solve's float64 G and Q serve the heads: no second E x E sum
        self.rls = rls if isinstance(rls, GramRLS) and rls.dtype == np.float64 else None
        # ridge_all's folds kept by the solve's η rules (`solver.select`)
        self.shares_fold = shares_fold
        own = [h for h in params.heads if not (shares_fold and h == "ridge_all")]
        self.stats = hd.HeadStats(
            params.width,
            feature_dim,
            classes,
            xp=backend.xp,
            seed=params.seed,
            holdout=params.holdout,
            heads=tuple(own),
            dsal_eta=params.etas[0],
            own_gram=self.rls is None,
        )
        self.needs_z = "dsal" in params.heads
        self._full: Any = None  # the lent G made whole, one buffer
        self.solved: dict[int, dict[str, Any]] = {}
        self._row = 0

    def start_step(self, labels: np.ndarray) -> None:
        """Count the step's training labels (AIR's and LDA's 1/n_y)."""
        self.stats.begin_task(self.backend.asarray(labels))
        self._row = 0

    def absorb(self, H: Any, X: np.ndarray, y: np.ndarray, Z: Any = None) -> None:
        """Add one chunk; a row's id is its index among the step's rows."""
        ids = np.arange(self._row, self._row + len(y))
        self._row += len(y)
        xp = self.backend.xp
        if self.needs_z:  # DS-AL's residual reads the main stream's G and Q
            self._lend()
        self.stats.add(H, xp.asarray(X), xp.asarray(y), xp.asarray(ids), Z)

    def _lend(self) -> None:
        """The solve's G and Q, when shared and a head reads them (ridge_all's
        path, DS-AL's main stream): G as it is on NumPy (the heads read its
        lower triangle), made whole from it on CuPy."""
        if self.rls is None or not {"ridge_all", "dsal"} & set(self.params.heads):
            return
        G, xp = self.rls.G_, self.backend.xp
        if xp is np:  # the heads read the lower triangle (`solver.heads`)
            self.stats.lend_gram(G, self.rls.Q_)
            return
        if self._full is None:
            self._full = xp.empty(G.shape, dtype=G.dtype)
        _symmetrize(self._full, G, xp)
        self.stats.lend_gram(self._full, self.rls.Q_)

    def end_step(
        self,
        step: int,
        classes_seen: int,
        eta: float,
        W_ridge: np.ndarray,
        over_tasks: tuple[float, list[float]] | None = None,
    ) -> None:
        """Close the step and solve every head asked (arrays on the host);
        `W_ridge`: the step's W of weights.h5, which is the ridge head;
        `over_tasks`: ridge_all's η and the grid's errors when the solve's
        η rules chose it (`shares_fold`)."""
        self.stats.end_task()
        self._lend()
        out: dict[str, Any] = {"eta": eta, "classes_seen": classes_seen}
        for name in self.params.heads:
            if name == "ridge":
                out[name] = {"W": W_ridge}
            elif name == "ridge_all":
                out[name] = self._ridge_all(eta, W_ridge, over_tasks)
            else:
                out[name] = _solve_head(self.stats, name, eta, self.params)
        self.solved[step] = self._to_host(out, classes_seen)
        if "ridge_all" in out:
            log.info(
                "solve: step %d: head ridge_all eta %g", step, out["ridge_all"]["eta"]
            )

    def nbytes(self) -> int:
        """Bytes of the heads' own sums, ridge_all's folds (float64) counted
        when the solve's η rules keep them."""
        s, fold = self.stats, 0
        if self.shares_fold:
            fold = hd.head_bytes(s.E, s.D, s.C, "ridge_all")
        return s.nbytes() + fold

    def _ridge_all(
        self, eta: float, W_ridge: Any, over_tasks: tuple[float, list[float]] | None
    ) -> dict[str, Any]:
        """The joint ridge at the all-task rule's η, refitted on every row
        (`W_ridge` when that η is the step's own)."""
        if over_tasks is None:
            if self.shares_fold:
                raise AssertionError("ridge_all: the solve's η rules chose no eta")
            over_tasks = hd.eta_over_tasks(self.stats, list(self.params.eta_grid))
        chosen, sse = over_tasks
        W = W_ridge if chosen == eta else hd.ridge(self.stats, chosen)
        return {"W": W, "eta": chosen, "sse": sse}

    def _to_host(self, out: dict[str, Any], k: int) -> dict[str, Any]:
        """Arrays to the host, cut to the C_k classes seen."""
        host: dict[str, Any] = {}
        for name, value in out.items():
            if isinstance(value, dict):
                value = {key: self._host(key, a, k) for key, a in value.items()}
            host[name] = value
        return host

    def _host(self, key: str, a: Any, k: int) -> Any:
        if not hasattr(a, "shape"):
            return a  # eta, sse
        a = a if isinstance(a, np.ndarray) else self.backend.to_host(a)
        cut = a[:, :k] if key in ("W", "W_main", "W_comp") else a[:k]
        return np.ascontiguousarray(cut)


def _symmetrize(full: Any, G: Any, xp: Any, block: int = 1024) -> None:
    """full = G made whole from its lower triangle, a block of columns at a
    time: no E x E temporary beside `full`."""
    for j in range(0, G.shape[0], block):
        b = slice(j, j + block)
        full[j:, b] = G[j:, b]  # the block's lower part, its diagonal block too
        full[:j, b] = G[b, :j].T  # above the diagonal block: the rows' lower part
        d = full[b, b]
        d[...] = xp.tril(d) + xp.tril(d, -1).T


def _solve_head(
    s: hd.HeadStats, name: str, eta: float, params: SolveParams
) -> dict[str, Any]:
    """One head's arrays from the sums (see `solver.heads`)."""
    if name == "air":
        return {"W": hd.air(s, eta)}
    if name == "dsal":  # its residuals were taken at its own η, batch by batch
        main = s.dsal_main if s.dsal_main is not None else hd.ridge(s, s.dsal_eta)
        return {"W_main": main, "W_comp": hd.dsal(s, s.dsal_eta), "eta": s.dsal_eta}
    if name == "ncm":
        return {"means": hd.class_means(s)}
    if name == "lda":
        coef, icpt = hd.lda(s, params.lda_shrinkage)
        return {"coef": coef, "intercept": icpt}
    raise AssertionError(name)


def _head_bytes(fit: HeadsFit) -> dict[str, int]:
    """Bytes of each head's own sums, and `shared`: G, Q and the counts.
    ridge_all's folds count as its own when the η rules keep them."""
    s = fit.stats
    out = {"shared": 8 * (s.E * s.E + s.E * s.C + s.C)}
    return out | {h: hd.head_bytes(s.E, s.D, s.C, h) for h in fit.params.heads}


def write_heads(path: Path, fit: HeadsFit, feature_dim: int) -> Path:
    """heads.h5 of every step solved, renamed into place when whole."""
    p = fit.params
    with atomic_path(path) as tmp, h5py.File(tmp, "w") as f:
        attrs = {
            "heads": json.dumps(list(p.heads)),
            "width": p.width,
            "seed": p.seed,
            "dtype": p.dtype,
            "feature_dim": feature_dim,
            "dsal_ratio": p.dsal_ratio,
            "lda_shrinkage": p.lda_shrinkage,
            "holdout": p.holdout,
            "eta_grid": json.dumps(list(p.eta_grid)),
            "state_bytes": fit.nbytes(),
            "head_bytes": json.dumps(_head_bytes(fit)),
        }
        f.attrs.update(attrs)
        for step, solved in sorted(fit.solved.items()):
            _write_step(f.create_group(f"step_{step:02d}"), solved)
    return path


def _write_step(g: h5py.Group, solved: Mapping[str, Any]) -> None:
    g.attrs["classes_seen"] = solved["classes_seen"]
    g.attrs["eta"] = solved["eta"]
    for name, arrays in solved.items():
        if not isinstance(arrays, dict):
            continue
        head = g.create_group(name)
        for key, value in arrays.items():
            if isinstance(value, np.ndarray):
                head.create_dataset(key, data=value)
            else:
                head.attrs[key] = json.dumps(value) if key == "sse" else value
