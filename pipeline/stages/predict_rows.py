"""`pal predict`'s input: the rows of a JSONL or CSV file read and checked,
each made a test `Sample` or given its one-line error (the formats and rules:
`pipeline.stages.predict`'s docstring)."""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path
from typing import Any

from palcore.codes import Missing
from palcore.errors import PalError
from pipeline.data.samples import Sample, text_problem

log = logging.getLogger(__name__)


MAX_PIXELS = 50_000_000  # a 50-megapixel photo decodes to 150 MB; larger is refused


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
    problem = path_problem(folder, image, allow_outside) if image is not None else None
    if problem:
        return problem
    if image is not None and not (folder / image).exists():
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


def path_problem(folder: Path, image: str, allow_outside: bool) -> str | None:
    """Why row image `image` (a path relative to the input's folder) cannot
    be read, or None (it is a regular file there, or absent). The path is
    resolved first: a symlink in the folder that points outside it is outside."""
    outside = "outside the input's folder (--allow-outside-paths reads it)"
    if not allow_outside and _outside(image):
        return f"image {image} lies {outside}"
    path = folder / image
    if not (path.exists() or path.is_symlink()):
        return None
    real = path.resolve()
    if not allow_outside and not real.is_relative_to(folder.resolve()):
        return f"image {image} resolves to {real}, {outside}"
    if real.is_dir():
        return f"image {image} is a directory"
    if not real.is_file():
        return f"image {image} is not a regular file"
    return None


def image_problem(path: Path, max_pixels: int) -> str | None:
    """Why the image file at `path` cannot be predicted from, or None: more
    pixels than `max_pixels` (read from its header, before decoding), a
    decompression bomb, or a file that does not decode."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            w, h = im.size
            if w * h > max_pixels:
                return (
                    f"image {path} has {w}×{h} pixels ({w * h / 1e6:.1f} MP), "
                    f"more than --max-megapixels {max_pixels / 1e6:g} allows"
                )
            if im.format == "JPEG":
                im.draft("RGB", (max(1, w // 8), max(1, h // 8)))
            im.load()
    except Image.DecompressionBombError as exc:
        return f"image {path} is a decompression bomb ({exc})"
    except Exception as exc:  # OSError, SyntaxError, ValueError…
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"cannot read image {path} ({reason})"
    return None


def row_id(row: dict[str, Any] | str) -> str | None:
    if not isinstance(row, dict) or row.get("id") in (None, ""):
        return None
    return str(row["id"])


def prepared_rows(
    input_path: Path,
    strict: bool,
    allow_outside: bool,
    max_pixels: int = MAX_PIXELS,
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
    bad = {i: image_problem(folder / i, max_pixels) for i in images}
    for n, s in made.items():
        if isinstance(s, Sample) and s.image is not None:
            problem = bad.get(s.image)
            if problem:
                made[n] = problem
    for n, row in raw:  # said per row: an unseen image changes the prediction
        s = made[n]
        if isinstance(s, Sample) and s.image is None and isinstance(row, dict):
            if row.get("image"):
                log.warning(
                    "%s: row %d: image %s not found: predicted without it",
                    input_path,
                    n,
                    folder / row["image"],
                )
    errors = {n: e for n, e in made.items() if isinstance(e, str)}
    if errors and strict:
        n = min(errors)
        raise PredictError(f"{input_path}: row {n}: {errors[n]}")
    return raw, made, errors
