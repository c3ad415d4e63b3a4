"""Reader of the demo dataset written by `pal demo` (`<root>/captions.json`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.data.datasets.base import (
    DatasetError,
    Listing,
    RawSample,
    expect,
    read_json,
)
from pipeline.data.samples import SPLITS

FORMAT = "pal-demo"


def read(root: Path) -> Listing:
    """List the demo's samples; see `pipeline.stages.demo` for the file layout."""
    if not root.is_dir():
        raise DatasetError(
            f"data.root: dataset folder {root} not found (`pal demo` makes it)"
        )
    path = root / "captions.json"
    doc = read_json(path)
    expect(
        isinstance(doc, dict) and doc.get("format") == FORMAT,
        path,
        f"not a demo captions file (expected an object with format '{FORMAT}')",
    )
    names = _class_names(doc, path)
    rows: Any = doc.get("samples")
    expect(isinstance(rows, list), path, "'samples' must be a list")
    samples = [_sample(r, i, set(names), path) for i, r in enumerate(rows)]
    return Listing(root=root, samples=samples, classes=sorted(names), source=str(path))


def _class_names(doc: Any, path: Path) -> list[str]:
    """The names of captions.json's `classes`, each once."""
    classes = doc.get("classes")
    expect(isinstance(classes, list), path, "'classes' must be a list")
    names = []
    for i, c in enumerate(classes):
        expect(
            isinstance(c, dict) and isinstance(c.get("name"), str),
            path,
            f"classes[{i}] has no string 'name'",
        )
        names.append(c["name"])
    expect(len(set(names)) == len(names), path, "duplicate class names")
    return names


def _sample(r: Any, i: int, known: set[str], path: Path) -> RawSample:
    """Row `i` of captions.json's `samples`, checked."""
    expect(isinstance(r, dict), path, f"samples[{i}] is not an object")
    for key in ("id", "split", "class_name"):
        expect(isinstance(r.get(key), str), path, f"samples[{i}] has no string '{key}'")
    expect(
        r["split"] in SPLITS,
        path,
        f"samples[{i}] has split {r['split']!r}, expected train, val or test",
    )
    expect(
        r["class_name"] in known,
        path,
        f"samples[{i}] has unknown class {r['class_name']!r}",
    )
    image, text = r.get("image"), r.get("text")
    expect(
        image is None or isinstance(image, str),
        path,
        f"samples[{i}].image must be a string or null",
    )
    expect(
        text is None or isinstance(text, str),
        path,
        f"samples[{i}].text must be a string or null",
    )
    return RawSample(r["id"], r["split"], r["class_name"], image, text)
