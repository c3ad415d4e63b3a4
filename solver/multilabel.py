"""Multi-label metrics of RebQ's MM-IMDb protocol, in percent like `solver.metrics`.

Y (n, L) holds 0/1 targets and S (n, L) raw real scores (ridge outputs, not
probabilities: no sigmoid is applied). `columns` restricts a metric to some
labels (an index list; default all) and the macro mean runs over those.

- `macro_f1`  = 100 · mean_l 2TP_l / (2TP_l + FP_l + FN_l), predictions S > t
- `macro_map` = 100 · mean_l AP_l, AP = Σ_n (R_n − R_{n−1}) P_n (sklearn's)
- `task_matrix_summary`: avg, fg (RebQ's drop from the diagonal) and last from a
  T×T matrix of such a metric, M[i][j] = metric on task j after step i
- `task_matrices`: the F1 and mAP matrices of a weights file on multi-label
  test shards, task j scored on its own label columns (RebQ's evaluator)
- `score_steps` and `multilabel_metrics`: what `evaluate` writes for a weights
  file on multi-label shards (metrics.json under the single-label keys, with
  `measure: macro_f1` and a `map` group); `score_bp` the same of the BP head,
  whose logits pass through a sigmoid before the threshold
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from palcore.codes import Missing
from palcore.errors import ShardError
from palcore.outputs import task_group_name
from solver.metrics import acc, forgetting_diag, metrics_from_matrix

if TYPE_CHECKING:
    from solver.classifier import Classifier
    from solver.shard_readers import StepShards


def _targets_scores(
    Y: ArrayLike, S: ArrayLike, columns: Sequence[int] | None
) -> tuple[NDArray[np.bool_], NDArray[np.float64]]:
    """Y as bool (n, C) and S as float64 (n, C), restricted to `columns`."""
    Y_arr = np.asarray(Y)
    S_arr = np.asarray(S, dtype=np.float64)
    if Y_arr.shape != S_arr.shape:
        raise ValueError(
            f"Y has shape {Y_arr.shape} but S has shape {S_arr.shape}; "
            "one score per target expected"
        )
    if Y_arr.ndim != 2:
        raise ValueError(f"Y and S must be 2-D (n, L), got shape {Y_arr.shape}")
    if not np.isin(Y_arr, (0, 1)).all():
        raise ValueError("Y holds values other than 0 and 1")
    if columns is not None:
        idx = np.asarray(columns, dtype=np.intp)
        L = Y_arr.shape[1]
        if idx.ndim != 1 or idx.size == 0:
            raise ValueError("columns must be a non-empty list of label indices")
        if ((idx < -L) | (idx >= L)).any():
            raise ValueError(f"columns {idx.tolist()} out of range for {L} labels")
        Y_arr, S_arr = Y_arr[:, idx], S_arr[:, idx]
    if Y_arr.shape[1] == 0:
        raise ValueError("no label columns to average over")
    return Y_arr.astype(bool), S_arr


def macro_f1(
    Y: ArrayLike, S: ArrayLike, threshold: float, columns: Sequence[int] | None = None
) -> float:
    """Macro F1 (%) of the predictions S > threshold.

    F1_l = 2TP_l / (2TP_l + FP_l + FN_l) per label column l, and 0 for a column
    with 2TP + FP + FN = 0 (no positive target, no positive prediction), as
    sklearn's `zero_division=0`; the result is 100 · the unweighted mean of
    F1_l over `columns` (all by default).

    Y: (n, L) 0/1 targets; S: (n, L) real scores, thresholded as they are.
    """
    Y_b, S_f = _targets_scores(Y, S, columns)
    P = S_f > threshold
    tp = np.count_nonzero(P & Y_b, axis=0)
    fp = np.count_nonzero(P & ~Y_b, axis=0)
    fn = np.count_nonzero(~P & Y_b, axis=0)
    denom = 2 * tp + fp + fn
    f1 = np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)
    return 100.0 * float(f1.mean())


def _average_precision(y: NDArray[np.bool_], s: NDArray[np.float64]) -> float:
    """AP = Σ_n (R_n − R_{n−1}) P_n of one label column, R_0 = 0.

    The thresholds n are the distinct scores in decreasing order, so tied
    scores enter together (sklearn's `average_precision_score`); P_n and R_n
    are the precision and recall of s ≥ the n-th threshold. y: (n,) bool with
    at least one True; s: (n,) float.
    """
    assert y.any(), "AP needs a positive target"
    order = np.argsort(-s, kind="mergesort")
    s_sorted, y_sorted = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s_sorted)), s_sorted.size - 1]
    tps = np.cumsum(y_sorted)[last]
    precision = tps / (last + 1)
    recall = tps / tps[-1]
    return float(np.sum(np.diff(recall, prepend=0.0) * precision))


def macro_map(
    Y: ArrayLike, S: ArrayLike, columns: Sequence[int] | None = None
) -> float:
    """Macro mAP (%): 100 · mean_l AP_l over the label columns with a positive.

    AP_l as in `_average_precision`. A column without any positive target has
    no defined AP (recall is 0/0) and is left out of the mean; sklearn instead
    warns and scores it 0, so the result equals sklearn's
    `average_precision_score(..., average="macro")` on the columns that have a
    positive. ValueError when no column in `columns` has one.

    Y: (n, L) 0/1 targets; S: (n, L) real scores.
    """
    Y_b, S_f = _targets_scores(Y, S, columns)
    keep = np.flatnonzero(Y_b.any(axis=0))
    if keep.size == 0:
        raise ValueError("no label column has a positive target; mAP is undefined")
    aps = [_average_precision(Y_b[:, col], S_f[:, col]) for col in keep]
    return 100.0 * float(np.mean(aps))


def task_matrix_summary(
    M: Sequence[Sequence[float]] | NDArray[Any],
) -> dict[str, float]:
    """avg, fg and last of a T×T task matrix (rows: steps, columns: tasks).

    M[i][j] = metric on task j after step i for j ≤ i (0-based); the entries
    above the diagonal are not read, so row i needs at least i+1 entries.

    - `avg`  = mean_j M[T−1][j]                        (`solver.metrics.acc`)
    - `fg`   = mean_{j<T−1} (M[j][j] − M[T−1][j])      (`forgetting_diag`; 0 if T=1)
    - `last` = M[T−1][T−1]
    """
    rows = [np.asarray(row, dtype=np.float64).ravel() for row in M]
    if not rows:
        raise ValueError("empty task matrix")
    tri: list[list[float]] = []
    for i, row in enumerate(rows):
        if row.size < i + 1:
            raise ValueError(
                f"row {i + 1} of the task matrix has {row.size} entries, "
                f"at least {i + 1} expected"
            )
        tri.append(row[: i + 1].tolist())
    return {"avg": acc(tri), "fg": forgetting_diag(tri), "last": tri[-1][-1]}


def task_matrices(
    classifier: Classifier, steps: Sequence[StepShards], threshold: float
) -> dict[str, list[list[float]]]:
    """{"f1": M, "map": M} of `classifier` on the test shards of `steps`
    (multi-label: `targets` in every test block), M[k][j] the metric (%) on
    task j's test rows after step k (0-based, j ≤ k), over task j's own label
    columns [C_{j−1}, C_j), as RebQ's evaluator passes a task's columns.
    Scores are the ridge's raw outputs, thresholded at `threshold` for F1."""
    scored = score_steps(classifier, steps, threshold)
    return {"f1": scored.f1, "map": scored.map}


@dataclass
class Scored:
    """A weights file's multi-label scores on every step's test shards.

    f1, map: the task matrices (`task_matrices`); pooled_f1, pooled_map: per
    step, the metric over the rows of every seen task and every seen label
    column (the F1 analogue of evaluate's pooled accuracy, AIA's terms);
    f1_by_missing: at the last step, macro F1 over every label column of the
    test rows of each missing type (None for a type without rows)."""

    f1: list[list[float]] = field(default_factory=list)
    map: list[list[float]] = field(default_factory=list)
    pooled_f1: list[float] = field(default_factory=list)
    pooled_map: list[float] = field(default_factory=list)
    f1_by_missing: dict[str, float | None] = field(default_factory=dict)


BlockScores = tuple[NDArray[np.uint8], NDArray[Any], NDArray[np.int8]]


def score_steps(
    classifier: Classifier, steps: Sequence[StepShards], threshold: float
) -> Scored:
    """Score `classifier` on the multi-label test shards of `steps`: each test
    block read and up-sampled once per step (`Scored` says what is kept); the
    ridge's raw outputs are thresholded, no sigmoid first."""

    def at(step: StepShards) -> Callable[[int], BlockScores]:
        W = classifier.W(step.step)

        def scores(task: int) -> BlockScores:
            X, m, _ = _block_rows(step, task, bp=False)
            return _targets(step, task), classifier.logits(X, step.step, W), m

        return scores

    return _score(steps, threshold, at)


def score_bp(steps: Sequence[StepShards], threshold: float) -> Scored:
    """Score the BP head on the multi-label test shards of `steps` from their
    `bp_logits`: sigmoid(logit) > `threshold` for F1, as a head trained with
    BCE on logits is read (RebQ's torchmetrics does the same)."""

    def at(step: StepShards) -> Callable[[int], BlockScores]:
        def scores(task: int) -> BlockScores:
            _, m, bp = _block_rows(step, task, bp=True)
            assert bp is not None  # _block_rows read it
            sigmoid = 1.0 / (1.0 + np.exp(-bp.astype(np.float64)))
            return _targets(step, task), sigmoid, m

        return scores

    return _score(steps, threshold, at)


def bp_everywhere(steps: Sequence[StepShards]) -> bool:
    """Whether every test block of `steps` holds the BP head's logits."""
    return all(t.has_bp_logits for s in steps for t in s.test.values())


def _score(
    steps: Sequence[StepShards],
    threshold: float,
    at: Callable[[StepShards], Callable[[int], BlockScores]],
) -> Scored:
    """`Scored` of the scores `at(step)(task)` gives for every seen task's
    test block at every step."""
    bounds = [0, *(s.classes_seen for s in steps)]
    out = Scored()
    for k, step in enumerate(steps):
        scores = at(step)
        Ys, Ss, Ms = [], [], []
        f1_row, map_row = [], []
        for j in range(1, k + 2):
            Y, S, m = scores(j)
            cols = list(range(bounds[j - 1], bounds[j]))
            f1_row.append(macro_f1(Y, S, threshold, cols))
            map_row.append(_map(Y, S, cols, step.test[j].where))
            Ys.append(Y)
            Ss.append(S)
            Ms.append(m)
        out.f1.append(f1_row)
        out.map.append(map_row)
        Y_all, S_all = np.vstack(Ys), np.vstack(Ss)
        out.pooled_f1.append(macro_f1(Y_all, S_all, threshold))
        out.pooled_map.append(_map(Y_all, S_all, None, f"step {step.step}"))
    M_all = np.concatenate(Ms)
    for code in Missing:
        sel = M_all == code
        out.f1_by_missing[code.key] = (
            macro_f1(Y_all[sel], S_all[sel], threshold) if sel.any() else None
        )
    return out


def _targets(step: StepShards, task: int) -> NDArray[np.uint8]:
    """Targets (n, C_k) of `task`'s test block at `step`; one line when it
    has none or is empty."""
    block = step.test[task]
    Y = block.targets()
    if Y is None:
        raise ShardError(
            f"{block.where}: no targets, but other test shards are multi-label"
        )
    if block.n_rows == 0:
        raise ShardError(f"{block.where}: test set of {task_group_name(task)} is empty")
    return Y


def _block_rows(
    step: StepShards, task: int, bp: bool
) -> tuple[NDArray[Any], NDArray[np.int8], NDArray[Any] | None]:
    """Features, missing codes and (with `bp`) BP logits of `task`'s test
    block at `step`."""
    X, _, m, logits = step.test[task].read_all(with_bp_logits=bp)
    return X, m, logits


def _map(Y: NDArray[Any], S: NDArray[Any], cols: list[int] | None, where: str) -> float:
    try:
        return macro_map(Y, S, cols)
    except ValueError as e:  # no positive target in any column
        raise ShardError(f"{where}: {e}") from None


def multilabel_metrics(
    scored: Scored, threshold: float, digits: int = 6
) -> dict[str, Any]:
    """metrics.json of a multi-label evaluation, under the keys of the
    single-label one so the report, headline and grids read it unchanged:
    `measure` is "macro_f1" and acc, fg, fg_diag, aia, last, matrix,
    step_accuracy, acc_by_task and acc_by_missing hold macro F1 (%) at
    `threshold` (RebQ's Avg, Last and, as fg_diag, its forgetting); `map`
    holds acc, fg, fg_diag, aia, last and matrix on macro mAP."""

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    def summary(M: list[list[float]], pooled: list[float]) -> dict[str, Any]:
        out: dict[str, Any] = {
            key: r(v) for key, v in metrics_from_matrix(M, pooled).items()
        }
        out["matrix"] = [[r(a) for a in row] for row in M]
        return out

    out = summary(scored.f1, scored.pooled_f1)
    out["measure"] = "macro_f1"
    out["threshold"] = threshold
    out["step_accuracy"] = [r(a) for a in scored.pooled_f1]
    final = scored.f1[-1]
    out["acc_by_task"] = {
        "first": r(final[0]),
        "later": r(sum(final[1:]) / len(final[1:])) if len(final) > 1 else None,
    }
    out["acc_by_missing"] = {k: r(v) for k, v in scored.f1_by_missing.items()}
    out["map"] = summary(scored.map, scored.pooled_map)
    return out
