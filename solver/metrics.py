"""Class-incremental metrics from an accuracy matrix (DESIGN §6).

`matrix[k-1][i-1]` = a[k][i], the accuracy (%) on task i's test set after step
k over all classes seen at step k; row k holds tasks 1..k. With K steps:

- `acc`     = mean_i a[K][i]                                  (the paper's Acc)
- `fg`      = mean_{i<K} max_{z∈[i,K−1]} (a[z][i] − a[K][i])   (the paper's FG)
- `fg_diag` = mean_{i<K} (a[i][i] − a[K][i])                  (RebQ's variant)
- `aia`     = mean_k of the accuracy pooled over test tasks 1..k after step k
- `last`    = a[K][K]
- `acc_by_task`: `first` = a[K][1], the first task's accuracy after the last
  step (stability), and `later` = mean_{i>1} a[K][i], the later tasks'
  (plasticity; None with one step): the paper's stability/plasticity split

With one step there is nothing to forget: `fg` and `fg_diag` are 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from palcore.codes import Missing
from palcore.outputs import task_group_name

MISSING_KEYS = tuple(m.key for m in Missing)  # by code 0, 1, 2


def percent(correct: int, total: int) -> float | None:
    """100·correct/total, or None when there is nothing to count."""
    return 100.0 * correct / total if total else None


def _check_matrix(matrix: Sequence[Sequence[float]]) -> int:
    K = len(matrix)
    if K == 0:
        raise ValueError("empty accuracy matrix")
    for k, row in enumerate(matrix, start=1):
        if len(row) != k:
            raise ValueError(f"row {k} of the accuracy matrix has {len(row)} entries")
    return K


def acc(matrix: Sequence[Sequence[float]]) -> float:
    """Mean final accuracy over tasks: mean_i a[K][i]."""
    K = _check_matrix(matrix)
    return sum(matrix[-1]) / K


def forgetting(matrix: Sequence[Sequence[float]]) -> float:
    """FG: mean_{i<K} of the largest drop from any step z ∈ [i, K−1] to step K."""
    K = _check_matrix(matrix)
    if K == 1:
        return 0.0
    final = matrix[-1]
    drops = [
        max(matrix[z][i] for z in range(i, K - 1)) - final[i] for i in range(K - 1)
    ]
    return sum(drops) / (K - 1)


def forgetting_diag(matrix: Sequence[Sequence[float]]) -> float:
    """FG_diag: mean_{i<K} (a[i][i] − a[K][i]), the drop from when task i was learnt."""
    K = _check_matrix(matrix)
    if K == 1:
        return 0.0
    final = matrix[-1]
    return sum(matrix[i][i] - final[i] for i in range(K - 1)) / (K - 1)


@dataclass
class Counts:
    """Correct/total counts gathered by evaluate, for one classifier.

    correct[k-1][i-1], total[k-1][i-1]: task i's test set after step k.
    missing_correct[c], missing_total[c]: final step, pooled over all test tasks,
    by missing code c (0 complete, 1 text missing, 2 image missing).
    """

    correct: list[list[int]] = field(default_factory=list)
    total: list[list[int]] = field(default_factory=list)
    missing_correct: list[int] = field(default_factory=lambda: [0] * len(Missing))
    missing_total: list[int] = field(default_factory=lambda: [0] * len(Missing))

    def matrix(self) -> list[list[float]]:
        """a[k][i] in percent; an empty test set counts as 0 %."""
        return [
            [percent(c, t) or 0.0 for c, t in zip(crow, trow, strict=True)]
            for crow, trow in zip(self.correct, self.total, strict=True)
        ]

    def pooled(self) -> list[float]:
        """Per step k: accuracy (%) pooled over the test samples of tasks 1..k."""
        return [
            percent(sum(c), sum(t)) or 0.0
            for c, t in zip(self.correct, self.total, strict=True)
        ]


def metrics_from_matrix(
    matrix: Sequence[Sequence[float]], pooled: Sequence[float]
) -> Mapping[str, float]:
    """acc, fg, fg_diag, aia, last from a matrix and its pooled per-step accuracies."""
    _check_matrix(matrix)
    if len(pooled) != len(matrix):
        raise ValueError("one pooled accuracy per step expected")
    return {
        "acc": acc(matrix),
        "fg": forgetting(matrix),
        "fg_diag": forgetting_diag(matrix),
        "aia": sum(pooled) / len(pooled),
        "last": matrix[-1][-1],
    }


def summarize(counts: Counts, digits: int = 6) -> dict[str, object]:
    """The metrics dict: acc, fg, fg_diag, aia, last, matrix, step_accuracy
    (pooled over seen tasks, per step), acc_by_task, acc_by_missing.

    Floats are rounded to `digits` decimals so the JSON text is stable; a
    missing type without test samples gives None.
    """
    matrix = counts.matrix()

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, digits)

    out: dict[str, object] = {
        key: r(value)
        for key, value in metrics_from_matrix(matrix, counts.pooled()).items()
    }
    out["matrix"] = [[r(a) for a in row] for row in matrix]
    out["step_accuracy"] = [r(a) for a in counts.pooled()]  # aia's terms
    final = matrix[-1]
    later = final[1:]
    out["acc_by_task"] = {
        "first": r(final[0]),
        "later": r(sum(later) / len(later)) if later else None,
    }
    out["acc_by_missing"] = {
        key: r(percent(counts.missing_correct[c], counts.missing_total[c]))
        for c, key in enumerate(MISSING_KEYS)
    }
    return out


def metrics_json(metrics: dict[str, Any]) -> str:
    """Stable JSON text: sorted keys, fixed indent, trailing newline."""
    return json.dumps(metrics, sort_keys=True, indent=2) + "\n"


def matrix_csv(matrix: list[list[float]]) -> str:
    """Rows = steps, columns = tasks; cells after the diagonal are empty."""
    K = len(matrix)
    lines = ["step," + ",".join(task_group_name(i) for i in range(1, K + 1))]
    for k, row in enumerate(matrix, start=1):
        cells = [f"{a:.4f}" for a in row] + [""] * (K - len(row))
        lines.append(f"{k}," + ",".join(cells))
    return "\n".join(lines) + "\n"


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof 1; None for one value)."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return mean, None
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var)
