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
fit). A row that cannot be predicted (an image that does not decode, neither
image nor text, a malformed row) gets `{"row", "id", "error"}` instead, and
every other row is still predicted; `--strict` stops at the first such row
with its one-line error. A summary goes to stderr.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import click
import numpy as np

from palcore.cliutil import clean_errors, file_option, folder_option, params_option
from palcore.codes import Missing
from palcore.errors import PalError
from palcore.outputs import write_bytes_atomic
from palcore.params import load_section
from pipeline import params as pparams
from pipeline.data.samples import Sample, text_problem
from pipeline.model.backbone import load_backbone, resolve_device
from pipeline.model.checkpoint import (
    checkpoint_path,
    load_checkpoint,
    model_from_checkpoint,
)
from pipeline.model.embed import embed_samples
from pipeline.stages.prepare import unreadable_images
from solver.api import Classifier, SolveParams

log = logging.getLogger(__name__)


class PredictError(PalError):
    """Bad input rows, or a model and weights that do not fit together."""


def read_rows(path: Path) -> list[tuple[int, dict[str, Any] | str]]:
    """The rows of a JSONL or CSV file, numbered from 1: (row, the row's
    fields) or (row, what is wrong with it). A file that cannot be read at
    all is a `PredictError`."""
    if not path.is_file():
        raise PredictError(f"{path}: input file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PredictError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    rows: list[dict[str, Any] | str] = []
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if not reader.fieldnames or not {"image", "text"} & set(reader.fieldnames):
            raise PredictError(f"{path}: the CSV header needs an image or text column")
        try:
            rows.extend(reader)  # a quoted title may hold line breaks
        except csv.Error as exc:
            raise PredictError(
                f"{path}: row {len(rows) + 1}: malformed CSV ({exc})"
            ) from None
    else:
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                rows.append("not valid JSON")
                continue
            rows.append(row if isinstance(row, dict) else "expected a JSON object")
    if not rows:
        raise PredictError(f"{path}: no rows")
    return list(enumerate(rows, start=1))


def to_sample(
    row: dict[str, Any], n: int, folder: Path, allow_outside: bool = False
) -> Sample | str:
    """Row `n` as a sample (id `row n`, label unknown: 0), or what is wrong
    with it. An image file that does not exist is a missing image."""
    image = row.get("image") or None
    text = row.get("text") or ""
    if image is not None and not isinstance(image, str):
        return "image must be a path"
    if not isinstance(text, str):
        return "text must be a string"
    for key in ("image", "text", "id"):
        problem = text_problem(row.get(key))
        if problem:
            return f"{key} {problem}"
    if image is not None and not allow_outside and _outside(image):
        return (
            f"image {image} lies outside the input's folder "
            "(--allow-outside-paths reads it)"
        )
    if image is not None and not (folder / image).is_file():
        image = None  # absent: a missing modality, as in `pal prepare`
    if image is None and not text.strip():
        return "the row has neither an image (on disk) nor a text"
    missing = (
        Missing.IMAGE if image is None else Missing.TEXT if not text.strip() else 0
    )
    return Sample(f"row {n}", "test", 1, 0, "", image, text, int(missing))


def _outside(image: str) -> bool:
    """An absolute path, or one that climbs out with `..`."""
    path = Path(image)
    return path.is_absolute() or bool(path.drive) or ".." in path.parts


def _row_id(row: dict[str, Any] | str) -> str | None:
    if not isinstance(row, dict) or row.get("id") in (None, ""):
        return None
    return str(row["id"])


def predict(
    input_path: str | Path,
    tune_dir: str | Path,
    weights_path: str | Path,
    step: int | None = None,
    top_k: int = 5,
    batch_size: int = 32,
    device: str = "auto",
    solve_params: SolveParams | None = None,
    strict: bool = False,
    allow_outside: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Predictions of every row of `input_path` (in order) and a summary; a
    row that cannot be predicted gets its error (with `strict`, the first one
    is raised). Image paths outside the input's folder only `allow_outside`."""
    t0 = time.perf_counter()
    input_path, tune_dir = Path(input_path), Path(tune_dir)
    raw, made, errors = _prepared_rows(input_path, strict, allow_outside)
    folder = input_path.parent
    good = [(n, s) for n, s in made.items() if isinstance(s, Sample)]
    steps = sorted(int(p.stem[5:]) for p in tune_dir.glob("step_[0-9][0-9]*.pt"))
    if not steps:
        raise PredictError(f"{tune_dir}: no step_XX.pt checkpoints (run `pal tune`)")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise PredictError(
            f"--step {step}: {tune_dir} has the checkpoints of steps "
            f"{steps[0]}..{steps[-1]}"
        )
    ckpt = load_checkpoint(checkpoint_path(tune_dir, step))
    weights = Classifier(weights_path, partial=True)
    W = _weights_for(weights, step, ckpt, solve_params)
    dev = resolve_device(device, "--device")
    m = ckpt["params"]["model"]
    backbone = load_backbone(m["backbone"], m["max_text_len"]).place(dev)
    if weights.info.feature_dim != backbone.hidden_size:
        raise PredictError(
            f"{weights.path}: weights of feature_dim {weights.info.feature_dim}, but "
            f"the model's embeddings have {backbone.hidden_size}"
        )
    model = model_from_checkpoint(ckpt, backbone)
    names = ckpt["tasks"]["class_order"][: W.shape[1]]
    k = min(top_k, W.shape[1])
    predicted: dict[int, list[dict[str, Any]]] = {}
    if good:
        predicted = _scored(
            model, good, folder, partial(weights.logits, step=step, W=W),
            names, k, batch_size, device,
        )  # fmt: skip
    ids = {n: _row_id(row) for n, row in raw}
    rows = []
    for n, s in made.items():
        if isinstance(s, str):
            rows.append({"row": n, "id": ids[n], "error": s})
        else:
            missing = Missing(s.missing).key
            rows.append(
                {"row": n, "id": ids[n], "missing": missing, "top": predicted[n]}
            )
    for n, e in errors.items():
        log.warning("%s: row %d: %s (not predicted)", input_path, n, e)
    seconds = time.perf_counter() - t0
    summary = {
        "rows": len(rows),
        "errors": len(errors),
        "step": step,
        "classes": int(W.shape[1]),
        "seconds": round(seconds, 2),
        "rows_per_second": round(len(good) / seconds, 1),
    }
    return rows, summary


def _prepared_rows(
    input_path: Path, strict: bool, allow_outside: bool
) -> tuple[list[tuple[int, Any]], dict[int, Any], dict[int, str]]:
    """The input's rows, each as a Sample or its error (row number -> str);
    a row whose image is not found is predicted without it, with a warning."""
    raw = read_rows(input_path)
    folder = input_path.parent
    made = {
        n: to_sample(row, n, folder, allow_outside) if isinstance(row, dict) else row
        for n, row in raw
    }
    images = sorted(
        {s.image for s in made.values() if isinstance(s, Sample) and s.image}
    )
    bad = set(unreadable_images(folder, images))
    for n, s in made.items():
        if isinstance(s, Sample) and s.image in bad:
            made[n] = f"cannot read image {folder / s.image}"
    for n, row in raw:  # said per row: an unseen image changes the prediction
        s = made[n]
        if isinstance(s, Sample) and s.image is None and isinstance(row, dict):
            if row.get("image"):
                log.warning(
                    "%s: row %d: image %s not found: predicted without it",
                    input_path, n, folder / row["image"],
                )  # fmt: skip
    errors = {n: e for n, e in made.items() if isinstance(e, str)}
    if errors and strict:
        n = min(errors)
        raise PredictError(f"{input_path}: row {n}: {errors[n]}")
    return raw, made, errors


def _scored(
    model: Any,
    good: list[tuple[int, Sample]],
    folder: Path,
    score: Callable[[np.ndarray], np.ndarray],
    names: list[str],
    k: int,
    batch_size: int,
    device: str,
) -> dict[int, list[dict[str, Any]]]:
    """Row number -> its top-k classes and scores: extract's forward, then
    `score` (the classifier's logits of step k: (n, D) -> (n, C_k))."""
    predicted: dict[int, list[dict[str, Any]]] = {}
    x, _ = embed_samples(
        model,
        [s for _, s in good],
        folder,
        pparams.ExtractParams(batch_size=batch_size, device=device),
        desc="predict",
    )
    scores = score(x)  # (n, C_k)
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    for i, (n, _) in enumerate(good):
        predicted[n] = [
            {"class": names[c], "score": round(float(scores[i, c]), 6)} for c in top[i]
        ]
    return predicted


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
@click.option(
    "--step",
    type=int,
    default=None,
    help="Use the model and weights of this step (default: the last).",
)
@click.option("--top-k", default=5, show_default=True, help="Classes per row.")
@click.option("--batch-size", default=32, show_default=True, help="Rows per batch.")
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Where the ViLT forward runs.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Stop at the first row that cannot be predicted instead of reporting "
    "it in its output line.",
)
@click.option(
    "--allow-outside-paths",
    "allow_outside",
    is_flag=True,
    help="Read image paths outside INPUT's folder too (absolute, or with ..); "
    "without it such a row gets an error.",
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
    step: int | None,
    top_k: int,
    batch_size: int,
    device: str,
    strict: bool,
    allow_outside: bool,
    out: str,
) -> None:
    """Classify image–text rows with the tuned model and analytic weights.

    INPUT is a JSONL or CSV file whose rows have `image` (a path relative to
    INPUT's folder) and/or `text`, and optionally `id`; a missing image or text
    (or an image file that does not exist) takes PAL's missing-modality path.
    Writes one JSON line per row, numbered from 1, with the top-k classes and
    their scores, in input order; a row that cannot be predicted gets its error
    instead (--strict: stop at it). A summary goes to stderr.
    Checks the weights against the `solve:` section of --params when the file
    exists.
    """
    solve_p = (
        load_section(params_file, "solve", SolveParams)
        if Path(params_file).is_file()
        else None
    )
    rows, summary = predict(
        input_file, tune_dir, weights, step, top_k, batch_size, device, solve_p,
        strict, allow_outside,
    )  # fmt: skip
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
