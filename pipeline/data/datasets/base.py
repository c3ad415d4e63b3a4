"""What every dataset reader returns, and the helpers they share.

A multi-label dataset (MM-IMDb) lists each sample's classes in `labels`;
`pal prepare` puts the sample in the task of the first of them in the class
order (`pipeline.data.protocol.assign_multilabel`).

A reader lists samples; it never opens an image. `image` is a path relative to
the dataset root (or None when the dataset names no image for the sample) and
`text` is None when the dataset has no text for it. Whether a listed image file
really exists is answered by `FileIndex`, which lists each folder once (one
`os.listdir` per class folder instead of one `stat` per file).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from palcore.errors import PalError


class DatasetError(PalError, ValueError):
    """A dataset folder or file is missing, malformed or inconsistent."""


@dataclasses.dataclass(frozen=True, slots=True)
class RawSample:
    """One sample as a dataset lists it, before the protocol is applied."""

    id: str  # unique within the dataset
    split: str  # train | val | test
    class_name: str  # a multi-label sample's first class (`labels`)
    image: str | None  # path relative to the dataset root; None: none listed
    text: str | None  # None: the dataset has no text for it
    # a multi-label sample's classes, `class_name` among them (); a
    # single-label sample has none: its class is `class_name`
    labels: tuple[str, ...] = ()


@dataclasses.dataclass
class Listing:
    """A dataset's samples and classes, as read from its folder."""

    root: Path
    samples: list[RawSample]
    classes: list[str]  # class names kept, sorted
    dropped_classes: list[str] = dataclasses.field(default_factory=list)
    source: str = ""  # the file(s) the samples were listed from, for messages


class FileIndex:
    """Answers "does root/rel exist?" with one `os.listdir` per folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._names: dict[str, frozenset[str]] = {}

    def exists(self, rel: str) -> bool:
        folder, _, name = rel.rpartition("/")
        names = self._names.get(folder)
        if names is None:
            try:
                names = frozenset(os.listdir(self.root / folder))
            except (FileNotFoundError, NotADirectoryError):
                names = frozenset()
            self._names[folder] = names
        return name in names


def require_root(root: Path, key: str = "data.root") -> Path:
    """`root` as a Path; a `DatasetError` naming `key` when it is not a folder."""
    if not root.is_dir():
        raise DatasetError(f"{key}: dataset folder {root} not found")
    return root


def read_json(path: Path) -> Any:
    """Parse a JSON file; a missing or malformed file is a one-line `DatasetError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 text ({exc.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(
            f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def expect(ok: bool, path: Path, message: str) -> None:
    """Raise `DatasetError("path: message")` unless `ok`."""
    if not ok:
        raise DatasetError(f"{path}: {message}")
