"""The `solve` stage: stream the training shards once, write W_k of every step.

Steps are taken in order; within a step the train rows are streamed in chunks
of `batch_rows`, up-sampled (H = max(X W_up, 0)) and absorbed by the RLS state;
at each step's end W_k is solved for every η and appended to that η's weights
file. Memory is O(d² + chunk), independent of the number of rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from palcore.cliutil import (
    clean_errors,
    file_option,
    folder_option,
    run_params_option,
)
from palcore.errors import PalError
from palcore.params import Source, load_section
from palcore.progress import tqdm
from solver.backend import Backend, get_backend
from solver.chains import chains, check_chain_steps, pipeline_option
from solver.head_fit import HEADS_FILE, HeadsFit, write_heads
from solver.options import apply_overrides, override_options, verified_option
from solver.params import SolveParams, check_memory
from solver.rls import Expander, GramRLS, RidgeRLS, make_expander, make_rls
from solver.select import EtaSelector
from solver.shard_readers import StepShards, open_features
from solver.state import SolverState, StateInfo, check_state, load_state, save_state
from solver.weights import WeightsInfo, WeightsWriter, weights_name

log = logging.getLogger(__name__)


@dataclass
class _Fit:
    """One chain's fitting machinery: up-sampling, RLS state, η chooser."""

    params: SolveParams
    backend: Backend
    expand: Expander
    rls: RidgeRLS
    selector: EtaSelector | None  # eta: auto, or head ridge_all beside gram
    heads: HeadsFit | None  # solve.heads not empty only


def solve(
    features_dir: str | Path,
    out_dir: str | Path,
    params: SolveParams,
    backend: Backend | None = None,
    state: str | Path | None = None,
    save_state: str | Path | None = None,
) -> list[Path]:
    """Fit the RLS classifier on every step of `features_dir`; write weights.

    Returns the weights files written, one per η (in the order of
    `params.etas`): `out_dir/weights.h5` for a single η, or
    `out_dir/weights-eta<η>.h5` for each η of a sweep. Input errors raise a
    `PalError` before anything is renamed into place.

    `state`: start from a solver state after step k (`solver.state`) and read
    only the shards of steps k+1..; `save_state`: write the state after the
    last step.
    """
    for what, asked in (
        ("solve.eta auto", params.is_auto),
        ("solve.heads", params.heads),
    ):
        if asked and (state is not None or save_state is not None):
            raise PalError(f"{what} does not combine with --state/--save-state")
    backend = backend or get_backend(params.device)
    check_memory(params, *backend.memory(), gpu=backend.name == "cupy")
    start_from = load_state(state) if state is not None else None
    first = start_from.info.step + 1 if start_from else 1
    steps = open_features(features_dir, first=first)
    feature_dim = steps[0].feature_dim
    fit = _build(params, backend, steps)
    known = _resume(fit, state, start_from, feature_dim)
    _log_start(fit, steps, first, state if start_from else None)
    start = time.perf_counter()
    writers: list[WeightsWriter] = []
    try:
        writers = _open_writers(Path(out_dir), params, feature_dim, known, first)
        _stream(fit, steps, writers, known)
        if save_state is not None:
            _save_state(save_state, fit.rls, params, feature_dim, steps[-1], known)
        paths = [w.commit() for w in writers]
        _write_heads(Path(out_dir), fit, feature_dim)
    finally:
        for w in writers:
            w.discard()
    log.info(
        "solve: wrote %s in %.2f s",
        ", ".join(map(str, paths)),
        time.perf_counter() - start,
    )
    return paths


def _resume(
    fit: _Fit, path: str | Path | None, start_from: SolverState | None, dim: int
) -> list[dict[int, np.ndarray]]:
    """The RLS state continued from a solver state (checked to fit these
    params); returns, per η, the W_k of the steps before it when the state
    holds them for these η (else nothing known)."""
    known: list[dict[int, np.ndarray]] = [{} for _ in fit.params.etas]
    if path is None or start_from is None:
        return known
    check_state(path, start_from.info, _state_keys(fit.params, dim))
    fit.rls.import_state(start_from.arrays, start_from.info.n_rows)
    return start_from.weights if start_from.info.etas == fit.params.etas else known


def _state_keys(params: SolveParams, feature_dim: int) -> dict[str, Any]:
    """What a solver state must have been written with to be continued."""
    return {
        "method": params.method,
        "width": params.width,
        "seed": params.seed,
        "dtype": params.dtype,
        "feature_dim": feature_dim,
        "etas": params.etas,
    }


def _build(params: SolveParams, backend: Backend, steps: list[StepShards]) -> _Fit:
    """The up-sampling, the RLS state sized for the last step's classes, the
    η rules' folds (`eta: auto`, or head ridge_all beside `method: gram`,
    which then reads the same η path) and the heads."""
    max_classes = steps[-1].classes_seen
    multi = next((s for s in steps if s.train.has_targets), None)
    if multi is not None and (params.is_auto or params.heads):
        key = "solve.eta: auto" if params.is_auto else "solve.heads"
        raise PalError(
            f"{key}: {multi.train.where} holds multi-label targets; the η rules "
            "and heads score single-label rows (a fixed solve.eta, or a list, "
            "fits them)"
        )
    expand = make_expander(
        backend, steps[0].feature_dim, params.width, params.seed, params.dtype
    )
    rls = make_rls(
        params.method,
        backend,
        params.width,
        params.etas,
        max_classes=max_classes,
        dtype=params.dtype,
        expand=expand,
    )
    selector = None
    shares_fold = "ridge_all" in params.heads and isinstance(rls, GramRLS)
    if params.is_auto or shares_fold:
        selector = EtaSelector(
            backend,
            params.width,
            max_classes,
            params.dtype,
            params.eta_grid,
            params.holdout,
            params.seed,
            keep_rows=params.is_auto,
        )
    heads = None
    if params.heads:
        heads = HeadsFit(
            params, backend, steps[0].feature_dim, max_classes, rls, shares_fold
        )
    return _Fit(params, backend, expand, rls, selector, heads)


def _log_start(
    fit: _Fit, steps: list[StepShards], first: int, state: str | Path | None
) -> None:
    p = fit.params
    log.info(
        "solve: steps %d-%d, %d training rows, D=%d -> d=%d, method %s, eta %s, %s%s",
        first,
        steps[-1].step,
        sum(s.train.n_rows for s in steps),
        steps[0].feature_dim,
        p.width,
        p.method,
        "auto" if p.is_auto else ",".join(f"{e:g}" for e in p.etas),
        fit.backend.name,
        f", from the state after step {first - 1} ({state})" if state else "",
    )


def _open_writers(
    out_dir: Path,
    params: SolveParams,
    feature_dim: int,
    known: list[dict[int, np.ndarray]],
    first: int,
) -> list[WeightsWriter]:
    """One weights writer per η, holding the W_k already `known` for it."""
    writers = []
    for eta, earlier in zip(params.etas, known, strict=True):
        info = WeightsInfo(
            eta=0.0 if params.is_auto else eta,
            width=params.width,
            seed=params.seed,
            feature_dim=feature_dim,
            method=params.method,
            dtype=params.dtype,
        )
        name = weights_name(info.eta, params.is_sweep)
        writer = WeightsWriter(out_dir / name, info, min(earlier, default=first))
        writers.append(writer)  # discarded by the caller if the next lines fail
        for k in sorted(earlier):
            writer.add_step(k, earlier[k])
    return writers


def _stream(
    fit: _Fit,
    steps: list[StepShards],
    writers: list[WeightsWriter],
    known: list[dict[int, np.ndarray]],
) -> None:
    """Absorb every step's training rows chunk by chunk; after each step,
    solve W_k (for the chosen η with `auto`) and add it to each writer."""
    n_rows = sum(s.train.n_rows for s in steps)
    with tqdm(total=n_rows, unit="row", desc="solve", disable=None) as bar:
        for shards in steps:
            bar.set_postfix(step=shards.step)
            _absorb_step(fit, shards, bar)
            chosen, over_tasks = _choose_eta(fit, shards)
            etas = None if chosen is None else (chosen,)
            Ws = fit.rls.weights(shards.classes_seen, etas=etas)
            for writer, earlier, W in zip(writers, known, Ws, strict=True):
                writer.add_step(shards.step, W, eta=chosen)
                earlier[shards.step] = W
            if fit.heads is not None:
                eta = fit.params.etas[0] if chosen is None else chosen
                fit.heads.end_step(
                    shards.step, shards.classes_seen, eta, Ws[0], over_tasks
                )


def _absorb_step(fit: _Fit, shards: StepShards, bar: tqdm) -> None:
    """Stream one step's training rows into the RLS state (and the chooser's
    held-out statistics)."""
    if fit.selector is not None:
        fit.selector.start_step()
    if fit.heads is not None:
        fit.heads.start_step(shards.train.labels())
    targets, row = shards.train.targets(), 0  # multi-hot of a multi-label shard
    for X, y, _, _ in shards.train.iter_chunks(fit.params.batch_rows):
        T = y if targets is None else targets[row : row + len(y)]
        row += len(y)
        Z = None
        if fit.heads is not None and fit.heads.needs_z:
            Z = fit.expand.pre(X)  # DS-AL's stream reads tanh(Z)
            H = fit.backend.xp.maximum(Z, 0)
        else:
            H = fit.expand(X)  # (r, d), freed before the next chunk's
        fit.rls.partial_fit(H, fit.backend.asarray(T), shards.classes_seen, X=X)
        if fit.selector is not None:
            fit.selector.absorb(H, X, y)
        if fit.heads is not None:
            fit.heads.absorb(H, X, y, Z)
        del H, Z
        bar.update(len(y))


def _choose_eta(
    fit: _Fit, shards: StepShards
) -> tuple[float | None, tuple[float, list[float]] | None]:
    """The η rules after a step, from one η path fitted without the folds:
    `eta: auto`'s η (the grid's best on this step's held-out rows; None
    otherwise, every η of `solve.eta` is solved) and head ridge_all's (η
    and the grid's held-out squared errors; None when it is not shared)."""
    if fit.selector is None:
        return None, None
    # the folds are kept beside solve.method gram only (SolveParams, _build)
    assert isinstance(fit.rls, GramRLS)
    path = fit.selector.path(fit.rls, shards.classes_seen)
    chosen = None
    if fit.params.is_auto:
        chosen, accs = fit.selector.current_task(path, fit.expand)
        log.info(
            "solve: step %d: eta %g (held-out accuracy %s)",
            shards.step,
            chosen,
            ", ".join(
                f"{e:g}: {a:.1f}%"
                for e, a in zip(fit.params.eta_grid, accs, strict=False)
            ),
        )
    over_tasks = None
    if "ridge_all" in fit.params.heads:
        over_tasks = fit.selector.over_tasks(path)
    return chosen, over_tasks


def _write_heads(out_dir: Path, fit: _Fit, feature_dim: int) -> None:
    """heads.h5 when `solve.heads` asks for heads; else a heads.h5 left by
    an earlier solve is removed, so that evaluate scores no stale heads."""
    path = out_dir / HEADS_FILE
    if fit.heads is not None:
        write_heads(path, fit.heads, feature_dim)
        log.info("solve: wrote %s (%s)", path, ", ".join(fit.params.heads))
    elif path.exists():
        path.unlink()
        log.info("solve: removed %s (solve.heads is empty)", path)


def _save_state(
    path: str | Path,
    rls: RidgeRLS,
    params: SolveParams,
    feature_dim: int,
    last: StepShards,
    weights: list[dict[int, np.ndarray]],
) -> None:
    info = StateInfo(
        method=params.method,
        width=params.width,
        seed=params.seed,
        dtype=params.dtype,
        feature_dim=feature_dim,
        etas=params.etas,
        step=last.step,
        classes_seen=last.classes_seen,
        n_rows=rls.n_rows_,
    )
    save_state(path, SolverState(info, rls.export_state(last.classes_seen), weights))
    log.info("solve: wrote the solver state after step %d to %s", last.step, path)


def solve_pipeline(
    params_file: Source,
    pipeline: str,
    features: str | Path,
    out: str | Path,
    overrides: Mapping[str, str | None] | None = None,
) -> list[Path]:
    """`solve` for every (variant, run) chain of `pipeline`, on one backend:
    `features/<v>/<r>` into `out/<v>/<r>`. `overrides`: the CLI's option
    strings over each chain's `solve:` section. Every chain's params and
    shards are checked before the first is fitted."""
    given = dict(overrides or {})
    todo = [
        (chain, apply_overrides(load_section(src, "solve", SolveParams), **given))
        for src, chain in chains(params_file, pipeline)
    ]
    check_chain_steps(params_file, pipeline, features)
    backend = get_backend(todo[0][1].device)
    paths = []
    for chain, params in todo:
        log.info("solve: chain %s", chain)
        paths += solve(Path(features) / chain, Path(out) / chain, params, backend)
    return paths


@click.command("solve")
@folder_option(
    "features", "data/extract", "Features folder: step_01/train.h5, test.h5, …"
)
@folder_option(
    "out", "data/solve", "Output folder for weights.h5 (weights-eta<η>.h5 for a sweep)."
)
@override_options
@verified_option
@file_option(
    "state",
    None,
    "Start from this solver state (written by --save-state after step k) and "
    "read only the shards of steps k+1..; those of steps 1..k may be gone.",
)
@file_option(
    "save-state",
    None,
    "Write the solver state after the last step (G and Q, or R and W, with the "
    "weights so far): 8·d² bytes per d×d matrix.",
)
@pipeline_option
@run_params_option
@clean_errors
def cli(
    features: str,
    out: str,
    state: str | None,
    save_state: str | None,
    pipeline: str | None,
    params_file: Source,
    **overrides: str | None,
) -> None:
    """Fit the analytic classifier after every step; write weights.h5.

    Streams each step's train shard once in row chunks, up-samples
    H = max(X·W_up, 0) with the seeded W_up of DESIGN §4, and solves the ridge
    classifier over all classes seen so far; W_k equals the joint ridge
    solution over all rows of steps 1..k. Options override the `solve:`
    section of the params file.

    With --pipeline NAME, every (variant, run) chain in one process and on one
    backend: FEATURES/<variant>/<run> into OUT/<variant>/<run>.
    """
    if pipeline is None:
        params = apply_overrides(
            load_section(params_file, "solve", SolveParams), **overrides
        )
        solve(features, out, params, state=state, save_state=save_state)
        return
    if state is not None or save_state is not None:
        raise PalError("--pipeline does not combine with --state or --save-state")
    solve_pipeline(params_file, pipeline, features, out, overrides)
