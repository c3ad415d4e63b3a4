"""`pal predict`: classify new image–text pairs with what the pipeline learnt.

The model of step k is rebuilt from `step_XX.pt`, its prompted joint
embedding is computed exactly as `pal extract` does (`embed_samples`, with a
missing image or text handled by PAL's reconstruction path), and the analytic
classifier of step k scores it (`solver.api.Classifier`): H = max(X W_up, 0)
with the weights file's own up-sampling, logits = H W_k. So predicting the
samples of a test shard gives the accuracy `pal-solver evaluate` reports for them.

Input: JSONL (one object per line) or CSV (a header row), each row with
`image` (a path relative to the input file's folder) and/or `text`, and
optionally `id`. An absent or empty field is a missing modality, and so is a
listed image file that does not exist (as `pal prepare` keeps it, with a
warning naming the row); a row needs one of the two. An image path outside
the input's folder (absolute, or climbing with `..`) is a row error unless
`--allow-outside-paths`: an input file must not make predict read any file
of the machine. Text that is not valid Unicode (a lone surrogate) is a row
error. Rows are numbered from 1 in the order they
come (a CSV's header and blank JSONL lines are no rows), in the output and in
every message, which names the input file.

Output: one JSON line per row, in input order, `{"row", "id", "missing",
"top": [{"class", "score"}, …]}` (`id` is the row's own or null) — `score` is
the ridge classifier's output for the class (about 1 for a confident one-hot
fit). A model tuned on multi-label data (its checkpoint's tasks say
`multi_label`) adds `"labels"`: the classes whose score exceeds the threshold
(`--threshold`, else `evaluate.threshold` of --params, else 0.5; the ridge's
raw score, no sigmoid, as evaluate's macro F1 reads it), highest first. A row
that cannot be predicted (an image that does not decode, neither
image nor text, a malformed row) gets `{"row", "id", "error"}` instead, and
every other row is still predicted; `--strict` stops at the first such row
with its one-line error. A summary goes to stderr.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import click
import numpy as np

from palcore.cliutil import clean_errors, file_option, folder_option, params_option
from palcore.codes import Missing
from palcore.outputs import step_of_name, write_bytes_atomic
from palcore.params import load_section
from palcore.paramsfile import read_params_file
from pipeline import params as pparams
from pipeline.data.samples import Sample
from pipeline.methods import model_from_checkpoint
from pipeline.model.backbone import load_backbone
from pipeline.model.checkpoint import checkpoint_path, load_checkpoint
from pipeline.model.device import resolve_device
from pipeline.model.embed import embed_samples
from pipeline.stages.predict_rows import (
    MAX_PIXELS,
    PredictError,
    prepared_rows,
    row_id,
)
from solver.api import Classifier, EvaluateParams, SolveParams, head_logits

log = logging.getLogger(__name__)


def predict(
    input_path: str | Path,
    tune_dir: str | Path,
    weights_path: str | Path,
    *,
    step: int | None = None,
    top_k: int = 5,
    batch_size: int = 32,
    device: str = "auto",
    solve_params: SolveParams | None = None,
    strict: bool = False,
    allow_outside: bool = False,
    max_pixels: int = MAX_PIXELS,
    head: str = "ridge",
    threshold: float | None = None,
    default_threshold: float = 0.5,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Predictions of every row of `input_path` (in order) and a summary; a
    row that cannot be predicted gets its error (with `strict`, the first one
    is raised). Image paths outside the input's folder only `allow_outside`.
    `head`: ridge (weights.h5) or a head of `solve.heads` (heads.h5 beside it).
    `threshold`: a multi-label model's labels are the classes scored above
    it (else `default_threshold`); a single-label model refuses it."""
    t0 = time.perf_counter()
    input_path, tune_dir = Path(input_path), Path(tune_dir)
    raw, made, errors = prepared_rows(input_path, strict, allow_outside, max_pixels)
    folder = input_path.parent
    good = [(n, s) for n, s in made.items() if isinstance(s, Sample)]
    step = _step(tune_dir, step)
    ckpt = load_checkpoint(checkpoint_path(tune_dir, step))
    weights = Classifier(weights_path, partial=True)
    W = _weights_for(weights, step, ckpt, solve_params)
    model = _model(ckpt, weights, device)
    names = ckpt["tasks"]["class_order"][: W.shape[1]]
    k = min(top_k, W.shape[1])
    score = _scorer(weights, W, step, head)
    cut = _threshold(ckpt, threshold, default_threshold, tune_dir)
    predicted: dict[int, dict[str, Any]] = {}
    if good:
        predicted = _scored(
            model, good, folder, Scoring(score, names, k, cut), batch_size, device
        )
    rows = _result_rows(raw, made, predicted)
    for n, e in errors.items():
        log.warning("%s: row %d: %s (not predicted)", input_path, n, e)
    seconds = time.perf_counter() - t0
    summary = {
        "rows": len(rows),
        "errors": len(errors),
        "step": step,
        "classes": int(W.shape[1]),
        "head": head,
        **({} if cut is None else {"threshold": cut}),
        "seconds": round(seconds, 2),
        "rows_per_second": round(len(good) / seconds, 1),
    }
    return rows, summary


def _scorer(
    weights: Classifier, W: np.ndarray, step: int, head: str
) -> Callable[[np.ndarray], np.ndarray]:
    """Features -> scores: the weights file's W_step (head ridge), or a head
    of `solve.heads` from the heads.h5 beside the weights file."""
    if head == "ridge":
        return partial(weights.logits, step=step, W=W)
    return head_logits(weights.path.with_name("heads.h5"), head, step, weights.backend)


def _threshold(
    ckpt: dict, threshold: float | None, default: float, tune_dir: Path
) -> float | None:
    """The score a multi-label model's labels must exceed (`threshold`, else
    `default`); None for a single-label model, which refuses an explicit one."""
    if threshold is not None and not math.isfinite(threshold):
        raise PredictError(f"--threshold must be a finite number, got {threshold}")
    if ckpt["tasks"].get("multi_label", False):
        return default if threshold is None else threshold
    if threshold is not None:
        raise PredictError(
            f"--threshold: {tune_dir} was tuned on single-label data; its rows "
            "get their top classes, no threshold"
        )
    return None


@dataclass(frozen=True)
class Scoring:
    """How embeddings become a row's output: `score` (features -> (n, C_k)
    scores), the class `names`, `k` classes in `top`, and (multi-label)
    `threshold`, above which a class is among the row's `labels`."""

    score: Callable[[np.ndarray], np.ndarray]
    names: list[str]
    k: int
    threshold: float | None = None

    def rows(self, scores: np.ndarray) -> list[dict[str, Any]]:
        """`top` (and `labels`) of each row of `scores` (n, C_k)."""
        order = np.argsort(-scores, axis=1, kind="stable")
        out = []
        for row, ranked in zip(scores, order, strict=True):
            item: dict[str, Any] = {
                "top": [
                    {"class": self.names[c], "score": round(float(row[c]), 6)}
                    for c in ranked[: self.k]
                ]
            }
            if self.threshold is not None:
                item["labels"] = [
                    self.names[c] for c in ranked if row[c] > self.threshold
                ]
            out.append(item)
        return out


def _step(tune_dir: Path, step: int | None) -> int:
    """The step to predict with: `step`, or the last one tuned."""
    names = (step_of_name(p.stem) for p in tune_dir.glob("step_[0-9][0-9]*.pt"))
    steps = sorted(n for n in names if n is not None)
    if not steps:
        raise PredictError(f"{tune_dir}: no step_XX.pt checkpoints (run `pal tune`)")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise PredictError(
            f"--step {step}: {tune_dir} has the checkpoints of steps "
            f"{steps[0]}..{steps[-1]}"
        )
    return step


def _model(ckpt: dict[str, Any], weights: Classifier, device: str) -> Any:
    """The tuned model of a checkpoint on `device`, its backbone's width
    checked against the weights' feature_dim."""
    dev = resolve_device(device, "--device")
    m = ckpt["params"]["model"]
    backbone = load_backbone(m["backbone"], m["max_text_len"]).place(dev)
    if weights.info.feature_dim != backbone.hidden_size:
        raise PredictError(
            f"{weights.path}: weights of feature_dim {weights.info.feature_dim}, but "
            f"the model's embeddings have {backbone.hidden_size}"
        )
    return model_from_checkpoint(ckpt, backbone)


def _result_rows(
    raw: list[tuple[int, Any]],
    made: dict[int, Any],
    predicted: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    """One output row per input row, in order: its top classes (and labels),
    or its error."""
    ids = {n: row_id(row) for n, row in raw}
    rows: list[dict[str, Any]] = []
    for n, s in made.items():
        if isinstance(s, str):
            rows.append({"row": n, "id": ids[n], "error": s})
        else:
            missing = Missing(s.missing).key
            rows.append({"row": n, "id": ids[n], "missing": missing, **predicted[n]})
    return rows


def _scored(
    model: Any,
    good: list[tuple[int, Sample]],
    folder: Path,
    scoring: Scoring,
    batch_size: int,
    device: str,
) -> dict[int, dict[str, Any]]:
    """Row number -> its top-k classes and scores (and labels): extract's
    forward, then `scoring` (the classifier's logits of step k)."""
    x, _ = embed_samples(
        model,
        [s for _, s in good],
        folder,
        pparams.ExtractParams(batch_size=batch_size, device=device),
        desc="predict",
    )
    rows = scoring.rows(scoring.score(x))  # scores (n, C_k)
    return {n: row for (n, _), row in zip(good, rows, strict=True)}


def _weights_for(
    weights: Classifier, step: int, ckpt: dict, solve_params: SolveParams | None
) -> np.ndarray:
    """W_step, after checking it fits the checkpoint and the params."""
    where = weights.path
    if not weights.first_step <= step <= weights.n_steps:
        raise PredictError(
            f"{where}: holds the weights of steps {weights.first_step}.."
            f"{weights.n_steps}, not step {step}"
        )
    seen = sum(ckpt["tasks"]["classes_per_task"][:step])
    if weights.classes_seen[step - 1] != seen:
        raise PredictError(
            f"{where}: step {step} has {weights.classes_seen[step - 1]} classes, "
            f"but the checkpoint's step {step} knows {seen}"
        )
    if solve_params is not None:
        for key in ("width", "seed"):
            have, want = getattr(weights.info, key), getattr(solve_params, key)
            if have != want:
                raise PredictError(
                    f"{where}: weights of {key} {have}, but solve.{key} is {want} "
                    "(rerun `pal-solver solve`, or pass --weights)"
                )
    return weights.W(step)


# how rows are read and scored: `predict`'s keywords (max_megapixels: its
# max_pixels, in millions)
ROW_OPTIONS = [
    click.option(
        "--step",
        type=int,
        default=None,
        help="Use the model and weights of this step (default: the last).",
    ),
    click.option("--top-k", default=5, show_default=True, help="Classes per row."),
    click.option("--batch-size", default=32, show_default=True, help="Rows per batch."),
    click.option(
        "--device",
        type=click.Choice(["auto", "cpu", "cuda"]),
        default="auto",
        show_default=True,
        metavar="auto|cpu|cuda",
        help="Where the ViLT forward runs.",
    ),
    click.option(
        "--strict",
        is_flag=True,
        help="Stop at the first row that cannot be predicted instead of reporting "
        "it in its output line.",
    ),
    click.option(
        "--allow-outside-paths",
        "allow_outside",
        is_flag=True,
        help="Read image paths outside INPUT's folder too (absolute, with .., or "
        "a symlink pointing out); without it such a row gets an error.",
    ),
    click.option(
        "--max-megapixels",
        type=click.FloatRange(min=0, min_open=True),
        default=MAX_PIXELS / 1e6,
        show_default=True,
        help="A row whose image has more pixels (read from its header, before "
        "decoding) gets an error instead of being decoded.",
    ),
]


def row_options(command: Callable) -> Callable:
    """`command` with every option of ROW_OPTIONS, in their order in --help."""
    for option in reversed(ROW_OPTIONS):
        command = option(command)
    return command


@click.command("predict")
@click.argument("input_file", metavar="INPUT", type=click.Path(dir_okay=False))
@params_option
@folder_option(
    "tune",
    "data/tune/pal/0",
    "Folder written by `pal tune` (default: run 0 of PAL in the pipeline).",
    dest="tune_dir",
)
@file_option(
    "weights",
    "data/solve/pal/0/weights.h5",
    "Weights file written by `pal-solver solve` (default: run 0 of PAL).",
)
@row_options
@click.option(
    "--head",
    default="ridge",
    show_default=True,
    metavar="NAME",
    help="Rank by this analytic head: ridge (the weights file) or one of "
    "solve.heads, read from heads.h5 beside the weights file.",
)
@click.option(
    "--threshold",
    type=float,
    default=None,
    help="Multi-label models: a row's labels are the classes scored above this "
    "(default: evaluate.threshold of --params, else 0.5).",
)
@click.option(
    "--out",
    default="-",
    show_default=True,
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Output JSONL file (- for stdout).",
)
@clean_errors
def cli(
    input_file: str,
    params_file: str,
    tune_dir: str,
    weights: str,
    out: str,
    max_megapixels: float,
    **options: Any,
) -> None:
    """Classify image–text rows with the tuned model and analytic weights.

    INPUT is a JSONL or CSV file whose rows have `image` (a path relative to
    INPUT's folder) and/or `text`, and optionally `id`; a missing image or text
    (or an image file that does not exist) takes PAL's missing-modality path.
    Writes one JSON line per row, numbered from 1, with the top-k classes and
    their scores, in input order; a row that cannot be predicted gets its error
    instead (--strict: stop at it). A model tuned on multi-label data (MM-IMDb)
    adds each row's labels: the classes scored above --threshold (default:
    evaluate.threshold of --params). A summary goes to stderr.
    Checks the weights against the `solve:` section of --params when the file
    exists.
    """
    has_params = Path(params_file).is_file()
    solve_p = load_section(params_file, "solve", SolveParams) if has_params else None
    evaluate_p = (
        load_section(params_file, "evaluate", EvaluateParams)
        if has_params and "evaluate" in read_params_file(Path(params_file))
        else EvaluateParams()
    )
    rows, summary = predict(
        input_file,
        tune_dir,
        weights,
        solve_params=solve_p,
        default_threshold=evaluate_p.threshold,
        max_pixels=int(max_megapixels * 1e6),
        **options,
    )
    _write_rows(rows, summary, out)


def _write_rows(rows: list[dict[str, Any]], summary: dict[str, Any], out: str) -> None:
    """One JSON line per row into `out` (- : stdout), the summary logged."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if out == "-":
        sys.stdout.write(text)
    else:
        write_bytes_atomic(out, text.encode("utf-8"))
    log.info(
        "predict: %d rows (%d not predicted) with step %d (%d classes) in %.2f s, "
        "%.1f rows/s -> %s",
        summary["rows"],
        summary["errors"],
        summary["step"],
        summary["classes"],
        summary["seconds"],
        summary["rows_per_second"],
        out if out != "-" else "stdout",
    )
