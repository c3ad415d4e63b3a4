"""The `evaluate` stage: the accuracy matrix of every step, metrics, a plot.

For every step k and every seen task i ≤ k, task i's test set (as extracted
under the prompts of step k) is up-sampled with the W_up regenerated from the
weights attrs, classified by argmax over H W_k (all C_k seen classes), and
counted. Shards with `bp_logits` are scored the same way for the BP head.

Outputs (in `--out`, each written atomically), for a weights file named
`weights<suffix>.h5` (suffix "" for `weights.h5`, "-eta0.1" for a sweep member):

- `metrics<suffix>.json`: acc, fg, fg_diag, aia, last (percent), matrix,
  acc_by_missing {complete, text_missing, image_missing} at the final step
  pooled over all test tasks, acc_by_task {first, later} (the first task's
  accuracy and the later tasks' mean after the last step: stability and
  plasticity), and `bp` with the same keys when present.
- `accuracy_matrix<suffix>.csv`: one row per step, one column per task.
- `step_accuracy<suffix>.csv`: step, al, bp — accuracy pooled over the test
  samples of the seen tasks after each step (bp empty without bp_logits).
- `step_accuracy<suffix>.png`: that table as a plot.

Several weights files that share width, seed and dtype (an η sweep) are scored
in one pass: each test chunk is read and up-sampled once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import click
import numpy as np

from palcore.cliutil import (
    clean_errors,
    folder_option,
    run_params_option,
)
from palcore.codes import Missing
from palcore.errors import PalError, ShardError
from palcore.outputs import task_group_name
from palcore.params import Source, load_section
from palcore.progress import tqdm
from solver.backend import Backend, get_backend
from solver.chains import chains, check_chain_steps, pipeline_option
from solver.classifier import Classifier
from solver.eval_outputs import Evaluation, write_multilabel, write_outputs
from solver.head_eval import evaluate_heads
from solver.metrics import Counts
from solver.multilabel import bp_everywhere, score_bp, score_steps
from solver.options import apply_overrides, metavar, verified_option
from solver.params import EvaluateParams, SolveParams
from solver.shard_readers import StepShards, open_features
from solver.weights import WEIGHTS_NAME, WeightsError, WeightsFile, check_solved_by

log = logging.getLogger(__name__)

WEIGHTS_GLOB = "weights-eta*.h5"


def resolve_weights(paths: Sequence[str | Path]) -> list[Path]:
    """Weights files from CLI paths; a folder stands for what `solve` writes
    there: its `weights-eta*.h5` (an η sweep), or else its `weights.h5`."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob(WEIGHTS_GLOB)) or sorted(p.glob(WEIGHTS_NAME))
            if not found:
                raise WeightsError(
                    f"{p}: no {WEIGHTS_NAME} or {WEIGHTS_GLOB} files in this folder"
                )
            out.extend(found)
        else:
            out.append(p)
    return out


def evaluate(
    features_dir: str | Path,
    weights_paths: Sequence[str | Path],
    out_dir: str | Path,
    backend: Backend | None = None,
    batch_rows: int = 4096,
    plot: bool = True,
    solve_params: SolveParams | None = None,
    threshold: float = 0.5,
) -> list[Path]:
    """Score every weights file on the test shards; write its outputs (the
    per-run plot only with `plot`). Multi-label test shards (`targets`) are
    scored by macro F1 at `threshold` and macro mAP instead of accuracy
    (`solver.multilabel`; no plot; the BP head's logits through a sigmoid).

    Returns the metrics files written, one per weights file. All inputs are
    validated (against `solve_params` too, when given) and all scores
    computed before the first output is written.
    """
    steps = open_features(features_dir)
    backend = backend or get_backend("cpu")
    files = [Classifier(p, backend) for p in resolve_weights(weights_paths)]
    for wf in files:
        _check_compatible(wf, steps)
        if solve_params is not None:
            check_solved_by(wf.path, wf.info, solve_params)
    evals = [Evaluation(wf, Counts(), None) for wf in files]
    suffixes = [e.suffix for e in evals]
    dupes = sorted({s for s in suffixes if suffixes.count(s) > 1})
    if dupes:
        raise WeightsError(f"two weights files would both write metrics{dupes[0]}.json")
    if any(t.has_targets for s in steps for t in s.test.values()):
        scored = [score_steps(wf, steps, threshold) for wf in files]
        bp_scored = score_bp(steps, threshold) if bp_everywhere(steps) else None
        return [
            write_multilabel(Path(out_dir), e, sc, threshold, bp_scored)
            for e, sc in zip(evals, scored, strict=True)
        ]
    has_bp = [t.has_bp_logits for s in steps for t in s.test.values()]
    if any(has_bp) and not all(has_bp):
        log.warning("evaluate: bp_logits only in some test shards; BP not scored")
    bp = Counts() if all(has_bp) else None

    groups: dict[tuple[int, int, str], list[Evaluation]] = {}
    for e in evals:
        i = e.weights.info
        groups.setdefault((i.width, i.seed, i.dtype), []).append(e)
    n_rows = sum(t.n_rows for s in steps for t in s.test.values()) * len(groups)
    with tqdm(total=n_rows, unit="row", desc="evaluate", disable=None) as bar:
        for g, members in enumerate(groups.values()):
            _score_group(
                steps, members, bp if g == 0 else None, backend, batch_rows, bar
            )
    for e in evals:
        e.bp = bp

    return [write_outputs(Path(out_dir), e, plot) for e in evals]


def _check_compatible(wf: Classifier, steps: list[StepShards]) -> None:
    info, where = wf.info, str(wf.path)
    if info.feature_dim != steps[0].feature_dim:
        raise WeightsError(
            f"{where}: solved for feature_dim {info.feature_dim}, but "
            f"the features have {steps[0].feature_dim}"
        )
    if wf.n_steps != len(steps):
        raise WeightsError(
            f"{where}: holds {wf.n_steps} steps, but the features have {len(steps)}"
        )
    for s, c in zip(steps, wf.classes_seen, strict=True):
        if c != s.classes_seen:
            raise WeightsError(
                f"{where}: step {s.step} has {c} classes, but the "
                f"features have {s.classes_seen}"
            )


def _score_group(
    steps: list[StepShards],
    members: list[Evaluation],
    bp: Counts | None,
    backend: Backend,
    batch_rows: int,
    bar: tqdm,
) -> None:
    """Fill the counts of `members` (same width, seed, dtype) and of `bp`."""
    xp = backend.xp
    expand = members[0].weights.expand  # the members' one up-sampling
    K = len(steps)
    for shards in steps:
        final = shards.step == K
        Ws = [backend.asarray(e.weights.W(shards.step)) for e in members]
        rows: list[tuple[list[int], list[int]]] = [([], []) for _ in members]
        bp_row: tuple[list[int], list[int]] = ([], [])
        for task in range(1, shards.step + 1):
            block = shards.test[task]
            if block.n_rows == 0:
                raise ShardError(
                    f"{block.where}: test set of {task_group_name(task)} is empty"
                )
            correct = [0] * len(members)
            bp_correct = 0
            for X, y, m, logits in block.iter_chunks(batch_rows, bp is not None):
                H = expand(X)  # (r, d)
                y_dev = backend.asarray(y)
                for j, W in enumerate(Ws):
                    hit = xp.argmax(H @ W, axis=1) == y_dev  # (r,) bool
                    correct[j] += int(hit.sum())
                    if final:
                        _count_missing(members[j].al, backend.to_host(hit), m)
                if bp is not None and logits is not None:  # read with bp only
                    hit_bp = np.argmax(logits, axis=1) == y
                    bp_correct += int(hit_bp.sum())
                    if final:
                        _count_missing(bp, hit_bp, m)
                bar.update(len(y))
                del H  # before the next chunk's is made
            for j in range(len(members)):
                rows[j][0].append(correct[j])
                rows[j][1].append(block.n_rows)
            bp_row[0].append(bp_correct)
            bp_row[1].append(block.n_rows)
        for e, (c, t) in zip(members, rows, strict=True):
            e.al.correct.append(c)
            e.al.total.append(t)
        if bp is not None:
            bp.correct.append(bp_row[0])
            bp.total.append(bp_row[1])


def _count_missing(counts: Counts, hit: np.ndarray, missing: np.ndarray) -> None:
    for code in Missing:
        sel = missing == code
        counts.missing_correct[code] += int(hit[sel].sum())
        counts.missing_total[code] += int(sel.sum())


_weights_option = click.option(
    "--weights",
    "weights",
    multiple=True,
    metavar="PATH",
    help="Weights file from `solve`; repeat for several. A folder means what "
    "solve wrote there: its weights-eta*.h5 files (an η sweep), or else its "
    "weights.h5. Default: the --solve folder.",
)
_report_option = click.option(
    "--report",
    metavar="DIR",
    type=click.Path(file_okay=False),
    default=None,
    help="With --pipeline: then write the report over every chain into DIR "
    "(as `pal-solver report --pipeline NAME --out DIR`).",
)


@click.command("evaluate")
@folder_option("features", "data/extract", "Features folder with the test shards.")
@_weights_option
@folder_option(
    "solve",
    "data/solve",
    "Folder of solve's weights, read when --weights is not given.",
)
@folder_option("out", "data/evaluate", "Output folder for metrics, CSVs and the plot.")
@click.option(
    "--device", metavar=metavar("device"), help="Backend for scoring [evaluate.device]."
)
@_report_option
@verified_option
@pipeline_option
@run_params_option
@clean_errors
def cli(
    features: str,
    weights: tuple[str, ...],
    solve: str,
    out: str,
    params_file: Source,
    device: str | None,
    report: str | None,
    pipeline: str | None,
) -> None:
    """Score the weights on every step's test shards; write metrics.

    Writes metrics.json (acc, fg, fg_diag, aia, last, matrix, acc_by_task,
    acc_by_missing, and bp for the BP head when the shards hold bp_logits),
    accuracy_matrix.csv, step_accuracy.csv and step_accuracy.png. For
    weights-eta<η>.h5 the names carry the same -eta<η> suffix. Reads the
    `evaluate:` section of the params file (device, batch_rows), and `solve:`
    to check the weights read from --solve (width, seed, method, dtype, η).

    With --pipeline NAME, every (variant, run) chain in one process: FEATURES/
    <variant>/<run> and SOLVE/<variant>/<run> into OUT/<variant>/<run>
    (without the per-chain plot; the report plots every variant); with
    --report DIR, then the report over them (tables and plots) into DIR.
    """
    params = apply_overrides(
        load_section(params_file, "evaluate", EvaluateParams), device=device
    )
    if pipeline is None:
        if report is not None:
            raise PalError("--report needs --pipeline")
        # what --solve holds must be what solve.* makes; --weights scores any file
        solved = None if weights else load_section(params_file, "solve", SolveParams)
        score = list(weights) or [solve]
        backend = get_backend(params.device)
        evaluate(
            features,
            score,
            out,
            backend,
            params.batch_rows,
            solve_params=solved,
            threshold=params.threshold,
        )
        if not weights:  # the heads solve wrote beside the weights, if any
            steps = open_features(features)
            evaluate_heads(steps, Path(solve), Path(out), backend, params.batch_rows)
        return
    if weights:
        raise PalError("--pipeline reads each chain's weights from --solve")
    evaluate_pipeline(params_file, pipeline, features, solve, out, params, report)


def evaluate_pipeline(
    params_file: Source,
    pipeline: str,
    features: str | Path,
    solve_dir: str | Path,
    out: str | Path,
    params: EvaluateParams,
    report: str | Path | None = None,
) -> list[Path]:
    """`evaluate` of every (variant, run) chain of `pipeline`, on one backend:
    `features/<v>/<r>` and `solve_dir/<v>/<r>` into `out/<v>/<r>` (no
    per-chain plot); then, with `report`, the report over them into that
    folder. Every chain's inputs are checked before the first is scored.
    Returns the metrics files written."""
    todo = [
        (chain, load_section(src, "solve", SolveParams))
        for src, chain in chains(params_file, pipeline)
    ]
    check_chain_steps(params_file, pipeline, features)
    for chain, solved in todo:
        for path in resolve_weights([Path(solve_dir) / chain]):
            check_solved_by(path, WeightsFile(path).info, solved)
    backend = get_backend(params.device)
    written = []
    for chain, solved in todo:
        log.info("evaluate: chain %s", chain)
        written += evaluate(
            Path(features) / chain,
            [Path(solve_dir) / chain],
            Path(out) / chain,
            backend,
            params.batch_rows,
            plot=False,
            solve_params=solved,
            threshold=params.threshold,
        )
        chain_features = open_features(Path(features) / chain)
        evaluate_heads(
            chain_features,
            Path(solve_dir) / chain,
            Path(out) / chain,
            backend,
            params.batch_rows,
        )
    if report is not None:
        from solver.report import protocol_report

        names = list(dict.fromkeys(chain.split("/")[0] for chain, _ in todo))
        protocol_report([Path(out)], names, Path(report), params_file.path)
    return written
