"""Evaluate's side of `solve.heads`: each head of heads.h5 scored on every
step's test shards (`heads.json` per run), and the report's heads table
(`heads.md`: every variant × head, mean ± std over the runs, with the η each
rule chose per step).

Scores of a test row X (H = max(X W_up, 0), Z = X W_up): ridge, ridge_all
and air H W; dsal H W_main + dsal_ratio · tanh(Z) W_comp; ncm the cosine of
H to each class mean; lda X coefᵀ + intercept. The class is the argmax.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from palcore.errors import PalError
from palcore.outputs import write_bytes_atomic
from solver import heads as hd
from solver.backend import Backend
from solver.head_fit import HEADS_FILE
from solver.metrics import Counts, mean_std, metrics_json, summarize
from solver.rls import make_expander
from solver.shard_readers import StepShards

HEADS_JSON = "heads.json"
HEADS_MD = "heads.md"  # the report's; with heads.json beside it
COLUMNS = ("acc", "fg", "last", "aia")
ETA_HEADS = ("ridge", "ridge_all", "air", "dsal")  # the heads with an η


def read_heads(path: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(attrs, {step: {head: {array or attr}, "eta": η}}) of a heads.h5."""
    try:
        with h5py.File(path, "r") as f:
            attrs = dict(f.attrs)
            attrs["heads"] = json.loads(attrs["heads"])
            attrs["head_bytes"] = json.loads(attrs["head_bytes"])
            steps = {int(name[5:]): _read_step(f[name]) for name in sorted(f)}
    except (OSError, KeyError) as exc:
        raise PalError(f"{path}: not a readable heads file ({exc})") from None
    return attrs, steps


def _read_step(g: h5py.Group) -> dict[str, Any]:
    out: dict[str, Any] = {"eta": float(g.attrs["eta"])}
    for head in g:
        out[head] = {k: g[head][k][()] for k in g[head]}
        for k, v in g[head].attrs.items():
            out[head][k] = json.loads(v) if k == "sse" else float(v)
    return out


def head_logits(
    path: Path, head: str, step: int, backend: Backend
) -> Callable[[np.ndarray], np.ndarray]:
    """Scores (n, C_step) on the host of backbone features X (n, D) by one
    head of a heads.h5 after `step`: what `pal predict --head` ranks by."""
    if not path.is_file():
        raise PalError(
            f"{path}: not found (solve.heads was empty: add {head} to it and "
            "rerun `pal-solver solve`)"
        )
    attrs, solved = read_heads(path)
    if head not in attrs["heads"]:
        raise PalError(
            f"{path}: no head {head!r} (it holds {', '.join(attrs['heads'])}; "
            "add it to solve.heads and rerun `pal-solver solve`)"
        )
    if step not in solved:
        raise PalError(f"{path}: holds steps {min(solved)}..{max(solved)}, not {step}")
    scorer, arrays = _Scorer(backend, attrs), solved[step][head]
    xp = backend.xp

    def logits(X: np.ndarray) -> np.ndarray:
        Z = scorer.expand.pre(X)
        Xd = xp.asarray(X, dtype=xp.float64)
        s = head_scores(head, arrays, xp.maximum(Z, 0), Z, Xd, scorer.ratio, xp)
        return backend.to_host(s)

    return logits


def head_scores(
    name: str, a: dict[str, Any], H: Any, Z: Any, X: Any, ratio: float, xp: Any
) -> Any:
    """Scores (r, C_k) of one head's arrays `a` for a test chunk."""
    if name in ("ridge", "ridge_all", "air"):
        return H @ xp.asarray(a["W"])
    if name == "dsal":
        Wm, Wc = xp.asarray(a["W_main"]), xp.asarray(a["W_comp"])
        return hd.dsal_scores(H, Z, Wm, Wc, ratio, xp)
    if name == "ncm":
        return hd.ncm_scores(H, xp.asarray(a["means"]), xp)
    if name == "lda":
        return X @ xp.asarray(a["coef"]).T + xp.asarray(a["intercept"])
    raise AssertionError(name)


def score_heads(
    steps: list[StepShards], path: Path, backend: Backend, batch_rows: int
) -> dict[str, Any]:
    """Every head's metrics (evaluate's keys) on the test shards; the heads
    with an η also with `eta_by_step` (ridge_all: the η its rule chose)."""
    attrs, solved = read_heads(path)
    if sorted(solved) != [s.step for s in steps]:
        raise PalError(f"{path}: steps {sorted(solved)}, the features have others")
    names = attrs["heads"]
    counts = {n: Counts() for n in names}
    scorer = _Scorer(backend, attrs)
    for shards in steps:
        correct, total = scorer.step(shards, solved[shards.step], batch_rows)
        for n in names:
            counts[n].correct.append(correct[n])
            counts[n].total.append(total)
    out: dict[str, Any] = {}
    for n in names:
        out[n] = {
            k: v for k, v in summarize(counts[n]).items() if k != "acc_by_missing"
        }
        if n in ETA_HEADS:
            out[n]["eta_by_step"] = [  # a head's own η (ridge_all, dsal) or the step's
                solved[k][n].get("eta", solved[k]["eta"]) for k in sorted(solved)
            ]
        out[n]["state_bytes"] = attrs["head_bytes"][n]
    out["shared_bytes"] = attrs["head_bytes"]["shared"]
    return out


class _Scorer:
    """The heads of one heads.h5 scored on test chunks (one up-sampling)."""

    def __init__(self, backend: Backend, attrs: dict[str, Any]) -> None:
        self.xp = backend.xp
        self.names: list[str] = attrs["heads"]
        self.ratio = float(attrs["dsal_ratio"])
        self.expand = make_expander(
            backend,
            int(attrs["feature_dim"]),
            int(attrs["width"]),
            int(attrs["seed"]),
            str(attrs["dtype"]),
        )

    def step(
        self, shards: StepShards, arrays: dict[str, Any], batch_rows: int
    ) -> tuple[dict[str, list[int]], list[int]]:
        """Correct rows per head and task, and each task's rows, after a step."""
        xp = self.xp
        correct: dict[str, list[int]] = {n: [] for n in self.names}
        total = []
        for task in range(1, shards.step + 1):
            block = shards.test[task]
            hits = dict.fromkeys(self.names, 0)
            for X, y, _, _ in block.iter_chunks(batch_rows):
                Z = self.expand.pre(X)
                H, Xd = xp.maximum(Z, 0), xp.asarray(X, dtype=xp.float64)
                for n in self.names:
                    s = head_scores(n, arrays[n], H, Z, Xd, self.ratio, xp)
                    hits[n] += int((xp.argmax(s, axis=1) == xp.asarray(y)).sum())
            for n in self.names:
                correct[n].append(hits[n])
            total.append(block.n_rows)
        return correct, total


def evaluate_heads(
    features_steps: list[StepShards],
    solve_dir: Path,
    out_dir: Path,
    backend: Backend,
    batch_rows: int,
) -> Path | None:
    """heads.json of one run when its solve wrote heads.h5 (else a stale
    heads.json is removed); returns the file written."""
    path = solve_dir / HEADS_FILE
    target = out_dir / HEADS_JSON
    if not path.exists():
        if target.exists():
            target.unlink()
        return None
    result = score_heads(features_steps, path, backend, batch_rows)
    return write_bytes_atomic(target, metrics_json(result).encode())


def heads_report(
    evaluations: Sequence[Path], variants: Sequence[str], runs: Sequence[int]
) -> dict[str, Any]:
    """The report's heads.json: per head, per variant, a row as metrics.json
    holds one (Acc, FG, Last, AIA as mean, std and runs; `label`), with
    `eta_by_step` (per run) for the heads with an η and `state_bytes`, the
    bytes of the head's own sums. Empty when no run has heads."""
    out: dict[str, Any] = {}
    for variant in variants:
        per_run = _runs(evaluations, variant, runs)
        if per_run is None:
            continue
        for head in (k for k in per_run[0] if k != "shared_bytes"):
            out.setdefault(head, {})[variant] = _head_row(variant, head, per_run)
    return out


def _head_row(variant: str, head: str, per_run: list[dict[str, Any]]) -> dict:
    row: dict[str, Any] = {"label": f"{variant}, head {head}"}
    for key in COLUMNS:
        values = [m[head][key] for m in per_run]
        mean, std = mean_std(values)
        row[key] = {"mean": round(mean, 6), "std": _round(std), "runs": values}
    if head in ETA_HEADS:
        row["eta_by_step"] = [m[head]["eta_by_step"] for m in per_run]
    row["state_bytes"] = per_run[0][head]["state_bytes"]
    return row


def heads_table(report: dict[str, Any], runs: Sequence[int]) -> str:
    """heads.md from `heads_report`: a row per variant × head (mean ± std
    over the runs; the head's own state in MiB), then the η per step of each
    run; one line when there are no heads."""
    if not report:
        return "No heads: solve.heads is empty.\n"
    lines = [
        "| Variant | Head | Acc | FG | Last | AIA | Own state (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    etas: list[str] = []
    for head, rows in report.items():
        for variant, row in rows.items():
            cells = [_cell(row[c]) for c in COLUMNS]
            mib = f"{row['state_bytes'] / 2**20:.2f}"
            lines.append(f"| {variant} | {head} | " + " | ".join([*cells, mib]) + " |")
            if "eta_by_step" in row:
                by_run = " | ".join(_etas(e) for e in row["eta_by_step"])
                etas.append(f"| {variant} | {head} | {by_run} |")
    title = "| Variant | Head | " + " | ".join(f"run {r}" for r in runs) + " |"
    note = (
        "η per step (ridge_all: the η of solve.eta_grid with the least squared "
        "error on the held-out folds of every task so far; the others: the η "
        "of weights.h5, which solve.eta auto chooses by accuracy on the "
        "current task's held-out rows):"
    )
    rule = "|---|---|" + "---|" * len(runs)
    return "\n".join([*lines, "", note, "", title, rule, *etas]) + "\n"


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _runs(
    evaluations: Sequence[Path], variant: str, runs: Sequence[int]
) -> list[dict[str, Any]] | None:
    root = next((r for r in evaluations if (r / variant).is_dir()), evaluations[0])
    paths = [root / variant / str(run) / HEADS_JSON for run in runs]
    if not any(p.exists() for p in paths):
        return None
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise PalError(f"{missing[0]}: not found (the other runs have heads)")
    return [json.loads(p.read_text(encoding="utf-8")) for p in paths]


def _etas(values: list[float]) -> str:
    return "; ".join(f"{e:g}" for e in values)


def _cell(stat: dict[str, Any]) -> str:
    mean, std = stat["mean"], stat["std"]
    return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"
