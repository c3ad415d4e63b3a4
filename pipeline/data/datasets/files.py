"""Reader of a dataset from files (`data.dataset: files`): one listing beside
the images, a layout anyone can write::

    <root>/listing.jsonl   or   <root>/listing.csv    (exactly one of them)
    <root>/<the image paths the listing names>

Each row (a JSON object per line, or a CSV row under a header) has the
columns `id`, `image`, `text`, `class` and `split` — `pal predict`'s input
rows plus the class and the split — and may carry more, which are ignored:

    id      unique; a JSONL id may be a number (read as its decimal string)
    image   a path relative to `<root>` with "/" separators; empty or null:
            the sample has no image
    text    empty, blank or null: the sample has no text
    class   the class name, kept as written (labels follow the sorted names
            and `data.class_order_seed`); in a JSONL listing also a list of
            names: a multi-label sample (MM-IMDb's kind), learnt in the task
            of its class first in the class order. One list makes the whole
            listing multi-label; a CSV listing is single-label
    split   train, val or test (val is optional)

An empty image or text is the dataset's own missing modality, handled by
`data.absent` like the real datasets' (`pipeline.data.absent`). Everything
else is refused in one line naming the file and its line, before any image
is decoded: a missing column, a row that does not parse, an empty id or
class, an unknown split, an id listed twice, an image path that leaves the
root or names no file on disk (a mistyped path must not become a missing
modality), and a class without a train or a test sample. Image paths are
checked as written: a symlink inside the root may point anywhere (a folder of
links into a shared image store is a dataset too).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.data.datasets.base import (
    DatasetError,
    FileIndex,
    Listing,
    RawSample,
    require_root,
)
from pipeline.data.samples import SPLITS

LISTINGS = ("listing.jsonl", "listing.csv")  # the file names looked for
COLUMNS = ("id", "image", "text", "class", "split")

Row = dict[str, Any]


def read(root: Path) -> Listing:
    """List the samples of the files-layout dataset at `root` (module doc)."""
    require_root(root)
    path = listing_file(root)
    rows = _jsonl_rows(path) if path.suffix == ".jsonl" else _csv_rows(path)
    index = FileIndex(root)
    samples: list[RawSample] = []
    first: dict[str, int] = {}  # id -> the line that listed it
    missing: list[tuple[int, str]] = []  # (line, image) named but not on disk
    for line, row in rows:
        s = _sample(path, line, row)
        if s.id in first:
            raise DatasetError(
                f"{path} line {line}: id {s.id!r} is listed twice "
                f"(first on line {first[s.id]})"
            )
        first[s.id] = line
        if s.image is not None and not index.exists(s.image):
            missing.append((line, s.image))
        samples.append(s)
    if missing:
        line, image = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise DatasetError(
            f"{path} line {line}: image {image!r} is not in {root}{more}; "
            "leave the field empty for a sample without an image"
        )
    if not samples:
        raise DatasetError(f"{path}: no rows")
    if any(s.labels for s in samples):  # multi-label: every row lists its classes
        samples = [
            s if s.labels else dataclasses.replace(s, labels=(s.class_name,))
            for s in samples
        ]
    classes = sorted({c for s in samples for c in _classes(s)})
    _check_classes(path, samples, classes)
    return Listing(root=root, samples=samples, classes=classes, source=str(path))


def _classes(s: RawSample) -> tuple[str, ...]:
    """The classes a sample carries: its labels, or its one class."""
    return s.labels or (s.class_name,)


def listing_file(root: Path) -> Path:
    """The one listing file in `root`; none or both is an error."""
    found = [root / name for name in LISTINGS if (root / name).is_file()]
    if len(found) != 1:
        which = "both" if found else "neither"
        raise DatasetError(
            f"{root}: holds {which} of {' and '.join(LISTINGS)}; a files "
            "dataset has exactly one listing"
        )
    return found[0]


def _check_classes(path: Path, samples: list[RawSample], classes: list[str]) -> None:
    """Every class has a train and a test sample (one that carries it)."""
    have = {(c, s.split) for s in samples for c in _classes(s)}
    for split in ("train", "test"):
        lacking = [c for c in classes if (c, split) not in have]
        if lacking:
            more = f" (and {len(lacking) - 1} more)" if len(lacking) > 1 else ""
            raise DatasetError(
                f"{path}: class {lacking[0]!r}{more} has no {split} sample; "
                "every class needs both train and test samples"
            )


def _sample(path: Path, line: int, row: Row) -> RawSample:
    """The row's sample; its faults named by file and line."""
    where = f"{path} line {line}"
    ident = row["id"]
    if isinstance(ident, int) and not isinstance(ident, bool):
        ident = str(ident)
    labels = _labels(where, row["class"])
    klass = labels[0] if labels else row["class"]
    fields = {"id": ident, "class": klass, "split": row["split"]}
    for key, value in fields.items():
        if not isinstance(value, str) or not value.strip():
            raise DatasetError(f"{where}: {key} must be a non-empty string")
    if row["split"] not in SPLITS:
        raise DatasetError(
            f"{where}: split {row['split']!r} is none of {', '.join(SPLITS)}"
        )
    for key in ("image", "text"):
        if row[key] is not None and not isinstance(row[key], str):
            raise DatasetError(f"{where}: {key} must be a string, empty or null")
    text = row["text"] if row["text"] and row["text"].strip() else None
    return RawSample(
        id=ident,
        split=row["split"],
        class_name=klass,
        image=_image(where, row["image"]),
        text=text,
        labels=labels,
    )


def _labels(where: str, value: Any) -> tuple[str, ...]:
    """A JSONL class given as a list: its names, in the row's order (each a
    non-empty string, none twice); () for a single class."""
    if not isinstance(value, list):
        return ()
    if not value or not all(isinstance(c, str) and c.strip() for c in value):
        raise DatasetError(
            f"{where}: class must be a non-empty string or a non-empty list of them"
        )
    twice = next((c for i, c in enumerate(value) if c in value[:i]), None)
    if twice is not None:
        raise DatasetError(f"{where}: class lists {twice!r} twice")
    return tuple(value)


def _image(where: str, image: str | None) -> str | None:
    """`image` normalised ('./a//b.jpg' → 'a/b.jpg'); None when empty; an
    absolute path or one climbing out of the root is an error."""
    if image is None or not image.strip():
        return None
    rel = posixpath.normpath(image)
    if posixpath.isabs(rel) or rel == ".." or rel.startswith("../"):
        raise DatasetError(
            f"{where}: image {image!r} is outside the dataset folder; image "
            "paths are relative to it"
        )
    return rel


def _text(path: Path) -> str:
    """The listing as text; not UTF-8 is an error naming the line."""
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: cannot be read ({exc.strerror})") from None
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = blob.count(b"\n", 0, exc.start) + 1
        raise DatasetError(f"{path} line {line}: not UTF-8 text") from None


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Row]]:
    """(line number, object) of each non-blank line."""
    for n, raw in enumerate(_text(path).split("\n"), 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DatasetError(
                f"{path} line {n}: not a JSON object ({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(row, dict):
            raise DatasetError(f"{path} line {n}: not a JSON object")
        absent = [c for c in COLUMNS if c not in row]
        if absent:
            raise DatasetError(
                f"{path} line {n}: no {absent[0]!r} (each row has the columns "
                f"{', '.join(COLUMNS)})"
            )
        yield n, row


def _csv_rows(path: Path) -> Iterator[tuple[int, Row]]:
    """(line number, {column: value}) of each row under the header."""
    reader = csv.reader(io.StringIO(_text(path), newline=""), strict=True)
    try:
        header = [c.strip() for c in next(reader, [])]
        absent = [c for c in COLUMNS if c not in header]
        if absent:
            raise DatasetError(
                f"{path} line 1: the header has no column {absent[0]!r} "
                f"(it needs {', '.join(COLUMNS)})"
            )
        for values in reader:
            if not values:
                continue
            if len(values) != len(header):
                raise DatasetError(
                    f"{path} line {reader.line_num}: {len(values)} fields, "
                    f"but the header has {len(header)}"
                )
            yield reader.line_num, dict(zip(header, values, strict=True))
    except csv.Error as exc:
        raise DatasetError(
            f"{path} line {reader.line_num}: malformed CSV ({exc})"
        ) from None
