"""The `solve` stage: stream the training shards once, write W_k of every step.

Steps are taken in order; within a step the train rows are streamed in chunks
of `batch_rows`, up-sampled (H = max(X W_up, 0)) and absorbed by the RLS state;
at each step's end W_k is solved for every η and appended to that η's weights
file. Memory is O(d² + chunk), independent of the number of rows.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click
import numpy as np
from tqdm import tqdm

from palcore.cliutil import (
    clean_errors,
    file_option,
    folder_option,
    run_params_option,
)
from palcore.errors import PalError
from palcore.params import Source, load_section
from solver.backend import Backend, get_backend
from solver.chains import chains, check_chain_steps, pipeline_option
from solver.options import apply_overrides, metavar
from solver.params import SolveParams
from solver.rls import Expander, RidgeRLS, make_rls, upsampling_matrix
from solver.select import EtaSelector
from solver.shards import StepShards, open_features
from solver.state import SolverState, StateInfo, check_state, load_state, save_state
from solver.weights import WeightsInfo, WeightsWriter, weights_name

log = logging.getLogger(__name__)


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
    if params.is_auto and (state is not None or save_state is not None):
        raise PalError("solve.eta auto does not combine with --state/--save-state")
    start_from = load_state(state) if state is not None else None
    first = start_from.info.step + 1 if start_from else 1
    steps = open_features(features_dir, first=first)
    backend = backend or get_backend(params.device)
    feature_dim = steps[0].feature_dim
    etas = params.etas
    if start_from is not None:
        check_state(
            state,
            start_from.info,
            {
                "method": params.method,
                "width": params.width,
                "seed": params.seed,
                "dtype": params.dtype,
                "feature_dim": feature_dim,
                "etas": etas,
            },
        )
    expand = Expander(
        backend, upsampling_matrix(feature_dim, params.width, params.seed), params.dtype
    )
    rls = make_rls(
        params.method,
        backend,
        params.width,
        etas,
        max_classes=steps[-1].classes_seen,
        dtype=params.dtype,
        expand=expand,
    )
    selector = (
        EtaSelector(
            backend,
            params.width,
            steps[-1].classes_seen,
            params.dtype,
            params.eta_grid,
            params.holdout,
            params.seed,
        )
        if params.is_auto
        else None
    )
    # W_k of the steps before `first`, per η, when the state has them for these η
    known: list[dict[int, np.ndarray]] = [{} for _ in etas]
    if start_from is not None:
        rls.import_state(start_from.arrays, start_from.info.n_rows)
        if start_from.info.etas == etas:
            known = start_from.weights
    out_dir = Path(out_dir)
    infos = [
        WeightsInfo(
            eta=0.0 if params.is_auto else eta,
            width=params.width,
            seed=params.seed,
            feature_dim=feature_dim,
            method=params.method,
            dtype=params.dtype,
        )
        for eta in etas
    ]
    n_rows = sum(s.train.n_rows for s in steps)
    log.info(
        "solve: steps %d-%d, %d training rows, D=%d -> d=%d, method %s, eta %s, %s%s",
        first,
        steps[-1].step,
        n_rows,
        feature_dim,
        params.width,
        params.method,
        "auto" if params.is_auto else ",".join(f"{e:g}" for e in etas),
        backend.name,
        f", from the state after step {first - 1} ({state})" if start_from else "",
    )
    start = time.perf_counter()
    writers: list[WeightsWriter] = []
    try:
        for info, earlier in zip(infos, known, strict=True):
            name = weights_name(info.eta, params.is_sweep)
            writer = WeightsWriter(out_dir / name, info, min(earlier, default=first))
            for k in sorted(earlier):
                writer.add_step(k, earlier[k])
            writers.append(writer)
        with tqdm(total=n_rows, unit="row", desc="solve", disable=None) as bar:
            for shards in steps:
                bar.set_postfix(step=shards.step)
                if selector is not None:
                    selector.start_step(shards.step, shards.train.n_rows)
                for X, y, _, _ in shards.train.iter_chunks(params.batch_rows):
                    H = expand(X)  # (r, d), freed before the next chunk's
                    rls.partial_fit(H, backend.asarray(y), shards.classes_seen, X=X)
                    if selector is not None:
                        selector.absorb(H, X, y)
                    del H
                    bar.update(len(y))
                chosen = None
                if selector is not None:
                    chosen, accs = selector.choose(rls, shards.classes_seen, expand)
                    rls.etas = (chosen,)
                    log.info(
                        "solve: step %d: eta %g (held-out accuracy %s)",
                        shards.step,
                        chosen,
                        ", ".join(
                            f"{e:g}: {a:.1f}%"
                            for e, a in zip(params.eta_grid, accs, strict=False)
                        ),
                    )
                for writer, earlier, W in zip(
                    writers, known, rls.weights(shards.classes_seen), strict=True
                ):
                    writer.add_step(shards.step, W, eta=chosen)
                    earlier[shards.step] = W
        if save_state is not None:
            _save_state(save_state, rls, params, feature_dim, steps[-1], known)
        paths = [w.commit() for w in writers]
    finally:
        for w in writers:
            w.discard()
    log.info(
        "solve: wrote %s in %.2f s",
        ", ".join(map(str, paths)),
        time.perf_counter() - start,
    )
    return paths


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


@click.command("solve")
@folder_option(
    "features", "data/extract", "Features folder: step_01/train.h5, test.h5, …"
)
@folder_option(
    "out", "data/solve", "Output folder for weights.h5 (weights-eta<η>.h5 for a sweep)."
)
@click.option(
    "--eta",
    metavar="X[,X…]|auto",
    help="Ridge regulariser η > 0 [solve.eta]. Several comma-separated "
    "values run a sweep: one pass over the shards, one weights file "
    "per η, named weights-eta<η>.h5. auto: per step, the η of "
    "solve.eta_grid most accurate on held-out rows of the current task.",
)
@click.option("--width", metavar="N", help="Up-sampling width d > 0 [solve.width].")
@click.option(
    "--seed", metavar="N", help="Seed of the up-sampling matrix [solve.seed]."
)
@click.option(
    "--method",
    metavar=metavar("method"),
    help="gram: G += HᵀH, Cholesky per step (fast); woodbury: the paper's "
    "RLS update per batch [solve.method].",
)
@click.option(
    "--device",
    metavar=metavar("device"),
    help="cpu: NumPy/SciPy; cuda: CuPy; auto: CuPy when a GPU passes a "
    "smoke test, else NumPy [solve.device].",
)
@click.option(
    "--dtype",
    metavar=metavar("dtype"),
    help="Accumulation and solve precision [solve.dtype].",
)
@click.option(
    "--batch-rows",
    metavar="N",
    help="Rows per streamed chunk and per Woodbury update [solve.batch_rows].",
)
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
    todo = [
        (chain, apply_overrides(load_section(src, "solve", SolveParams), **overrides))
        for src, chain in chains(params_file, pipeline)
    ]  # every chain's params checked before the first is fitted
    # and every chain's shards, with all its steps
    check_chain_steps(params_file, pipeline, features)
    backend = get_backend(todo[0][1].device)
    for chain, params in todo:
        log.info("solve: chain %s", chain)
        solve(Path(features) / chain, Path(out) / chain, params, backend=backend)
