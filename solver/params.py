"""`solve:` — the analytic-learning (RLS) stage's params (DESIGN §4, §7).

Loaded with `palcore.params.load_section(path, "solve", SolveParams)`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

from palcore.errors import ParamsError
from palcore.params import check

SolveMethod = Literal["gram", "woodbury"]
SolveDevice = Literal["auto", "cpu", "cuda"]
SolveDtype = Literal["float64", "float32"]
HeadName = Literal["ridge", "ridge_all", "air", "dsal", "ncm", "lda"]


def check_etas(etas: Sequence[float], key: str, listed: bool) -> None:
    """The one check of η values (`solve.eta`, `solve.eta_grid`, `--eta`):
    at least one, each finite and > 0, none twice. `listed`: the values came
    as a list, so a bad one is named by its index (`solve.eta[1]`)."""
    if not etas:
        raise ParamsError(f"{key} must not be an empty list")
    for i, eta in enumerate(etas):
        if not (math.isfinite(eta) and eta > 0):
            where = f"{key}[{i}]" if listed else key
            raise ParamsError(f"{where} must be > 0 and finite, got {eta!r}")
    dupes = sorted({e for e in etas if list(etas).count(e) > 1})
    if dupes:
        raise ParamsError(f"{key} lists {dupes[0]!r} twice")


@dataclasses.dataclass(frozen=True)
class SolveParams:
    """`solve:` — the analytic-learning (RLS) stage."""

    # ridge regulariser η (R_0 = I/η); a list of values is a sweep solved from
    # one pass over the shards, one weights file per value; "auto" chooses it
    # per step from `eta_grid` by accuracy on held-out rows of the current task
    eta: float | tuple[float, ...] | Literal["auto"] = 1.0
    width: int = 4096  # up-sampling width d (random ReLU layer D -> d)
    seed: int = 0  # seed of the up-sampling matrix W_up
    method: SolveMethod = "gram"  # gram: G += HᵀH + Cholesky; woodbury: RLS (Thm 1)
    device: SolveDevice = "auto"  # auto: CuPy when a working GPU is found
    dtype: SolveDtype = "float64"  # accumulation / solve precision
    batch_rows: int = 4096  # rows per streamed chunk (and per Woodbury update)
    eta_grid: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0, 100.0)  # eta: auto's choices
    holdout: float = 0.2  # eta: auto and head ridge_all: share of rows held out
    # closed-form heads fitted beside weights.h5 from the same pass (heads.h5,
    # scored by evaluate into heads.md): ridge, ridge_all (eta over every
    # task's held-out fold), air, dsal, ncm, lda; empty: none
    heads: tuple[HeadName, ...] = ()
    dsal_ratio: float = 1.0  # head dsal: weight of the compensation stream
    lda_shrinkage: float = 0.1  # head lda: shrinkage a of the shared covariance

    def __post_init__(self) -> None:
        if self.eta == "auto":
            check(self.method == "gram", "solve.eta", "auto needs solve.method gram")
        else:
            check_etas(self.etas, "solve.eta", isinstance(self.eta, tuple))
        check(self.width > 0, "solve.width", f"must be > 0, got {self.width}")
        check(self.seed >= 0, "solve.seed", f"must be >= 0, got {self.seed}")
        check(
            self.batch_rows > 0,
            "solve.batch_rows",
            f"must be > 0, got {self.batch_rows}",
        )
        check_etas(self.eta_grid, "solve.eta_grid", True)
        check(
            0.0 < self.holdout < 1.0,
            "solve.holdout",
            f"must lie in (0, 1), got {self.holdout}",
        )
        self._check_heads()

    def _check_heads(self) -> None:
        dupes = sorted({h for h in self.heads if self.heads.count(h) > 1})
        if dupes:
            raise ParamsError(f"solve.heads lists {dupes[0]!r} twice")
        check(
            math.isfinite(self.dsal_ratio) and self.dsal_ratio >= 0,
            "solve.dsal_ratio",
            f"must be >= 0 and finite, got {self.dsal_ratio!r}",
        )
        check(
            0.0 <= self.lda_shrinkage <= 1.0,
            "solve.lda_shrinkage",
            f"must lie in [0, 1], got {self.lda_shrinkage!r}",
        )

    @property
    def is_auto(self) -> bool:
        """True when η is chosen per step from held-out rows."""
        return self.eta == "auto"

    @property
    def etas(self) -> tuple[float, ...]:
        """The η values to solve for (one for a single run, several for a
        sweep; with `auto`, the one η each step starts from)."""
        eta = self.eta
        if isinstance(eta, str):  # auto
            return (1.0,)
        return eta if isinstance(eta, tuple) else (eta,)

    @property
    def is_sweep(self) -> bool:
        """True when `eta` is a list: outputs are named per η."""
        return isinstance(self.eta, tuple)


@dataclasses.dataclass(frozen=True)
class EvaluateParams:
    """`evaluate:` — scoring the weights on every step's test shards."""

    device: SolveDevice = "auto"  # auto: CuPy when a working GPU is found
    batch_rows: int = 4096  # test rows per scored chunk
    # multi-label F1: a label is predicted where its raw score > this
    threshold: float = 0.5

    def __post_init__(self) -> None:
        check(
            self.batch_rows > 0,
            "evaluate.batch_rows",
            f"must be > 0, got {self.batch_rows}",
        )
        check(
            math.isfinite(self.threshold),
            "evaluate.threshold",
            f"must be a finite number, got {self.threshold}",
        )


def solve_bytes(params: SolveParams, gpu: bool = False) -> tuple[int, int]:
    """(d×d matrices held, bytes): an upper estimate of a solve's peak memory,
    its width² terms (DESIGN §4): gram holds G and the factor of G + ηI,
    woodbury R and one factor; eta auto adds G_v and its factor; CuPy's
    Cholesky copies the matrix it factors and returns a new one."""
    count = 2 + 2 * (params.eta == "auto") + 2 * gpu
    item = 4 if params.dtype == "float32" else 8
    return count, count * params.width * params.width * item


def check_memory(params: SolveParams, where: str, have: int, gpu: bool) -> None:
    """One line when the solve cannot fit `have` bytes of `where`."""
    count, need = solve_bytes(params, gpu)
    if need > have:
        raise ParamsError(
            f"solve.width {params.width}: the solve holds about {need / 2**30:.1f} "
            f"GiB ({count} × {params.width}² {params.dtype}), but {where} is "
            f"{have / 2**30:.1f} GiB: lower solve.width"
        )
