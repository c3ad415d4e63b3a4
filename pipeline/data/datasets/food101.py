"""Reader of UPMC-Food101, in either of the two layouts in circulation.

(a) the missing-modality literature's layout (MAP, RebQ)::

        class_idx.json          {class name: index}
        split.json              {"train": [file, ...], "val": [...], "test": [...]}
        text.json               {file: title text}
        images/{train,test}/<class>/<file>

    The class of a file is its name without the trailing `_<number>.<ext>`
    (`frozen_yogurt_282.jpg` → `frozen_yogurt`); `val` files live in the train
    folder. A file without an entry in text.json has no text.

(b) the titles-CSV layout::

        images/{train,test}/<class>/<file>
        texts/{train,test}_titles.csv   rows: image_name,text,class_name

    The classes are the folders of images/train. A header row
    `image_name,text,class_name` is allowed and skipped. There is no val split.

The layout is (a) when `split.json` exists, else (b) when `texts/` exists.
After listing, the class with the fewest training samples (ties: the first by
name) is dropped, leaving the 100 classes of the papers. Sample ids are
`<split>/<file>`.
"""

from __future__ import annotations

import csv
import logging
from collections import Counter
from pathlib import Path

from pipeline.data.datasets.base import (
    DatasetError,
    Listing,
    RawSample,
    expect,
    read_json,
    require_root,
)

log = logging.getLogger(__name__)

CSV_HEADER = ["image_name", "text", "class_name"]


def read(root: Path) -> Listing:
    """List Food101's samples from `root` (layout detected), smallest class dropped."""
    require_root(root)
    if (root / "split.json").exists():
        listing = read_split_json(root)
    elif (root / "texts").is_dir():
        listing = read_titles_csv(root)
    else:
        raise DatasetError(
            f"{root}: not a Food101 folder (expected split.json, class_idx.json and "
            "text.json, or texts/{train,test}_titles.csv)"
        )
    return drop_smallest_class(listing)


def class_of_file(name: str) -> str:
    """`frozen_yogurt_282.jpg` → `frozen_yogurt`."""
    return name.rsplit("_", 1)[0] if "_" in name else ""


def read_split_json(root: Path) -> Listing:
    """Layout (a): class_idx.json, split.json, text.json."""
    idx_path, split_path, text_path = (
        root / "class_idx.json",
        root / "split.json",
        root / "text.json",
    )
    class_idx = read_json(idx_path)
    expect(
        isinstance(class_idx, dict) and bool(class_idx),
        idx_path,
        "expected a non-empty object {class name: index}",
    )
    splits = read_json(split_path)
    expect(isinstance(splits, dict), split_path, "expected an object {split: [files]}")
    unknown = sorted(set(splits) - {"train", "val", "test"})
    expect(not unknown, split_path, f"unknown split {unknown[0] if unknown else ''!r}")
    for split in ("train", "test"):
        expect(split in splits, split_path, f"no '{split}' list")
    texts = read_json(text_path)
    expect(isinstance(texts, dict), text_path, "expected an object {file: text}")

    samples = []
    for split in ("train", "val", "test"):
        files = splits.get(split, [])
        expect(
            isinstance(files, list), split_path, f"'{split}' must be a list of files"
        )
        folder = "test" if split == "test" else "train"
        for i, name in enumerate(files):
            expect(
                isinstance(name, str) and bool(name),
                split_path,
                f"{split}[{i}] is not a file name",
            )
            cls = class_of_file(name)
            expect(
                cls in class_idx,
                split_path,
                f"{split}[{i}] '{name}' has class {cls!r}, not in class_idx.json",
            )
            text = _title(texts.get(name), text_path, name)
            samples.append(_sample(split, folder, cls, name, text))
    return Listing(
        root=root,
        samples=samples,
        classes=sorted(class_idx),
        source=str(split_path),
    )


def _sample(
    split: str, folder: str, cls: str, name: str, text: str | None
) -> RawSample:
    """Image `name` of class `cls` under images/<folder>/, listed in `split`."""
    return RawSample(
        id=f"{split}/{name}",
        split=split,
        class_name=cls,
        image=f"images/{folder}/{cls}/{name}",
        text=text,
    )


def _title(value: object, path: Path, name: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = " ".join(value)
    expect(isinstance(value, str), path, f"text of '{name}' is not a string")
    assert isinstance(value, str)  # expect raised otherwise
    return value


def read_titles_csv(root: Path) -> Listing:
    """Layout (b): images/{train,test}/<class>/ and texts/{train,test}_titles.csv."""
    train_dir = root / "images" / "train"
    expect(train_dir.is_dir(), root, "layout with texts/ needs images/train/<class>/")
    classes = sorted(p.name for p in train_dir.iterdir() if p.is_dir())
    expect(bool(classes), train_dir, "no class folders")
    known = set(classes)
    samples = []
    for split in ("train", "test"):
        path = root / "texts" / f"{split}_titles.csv"
        for line, (name, text, cls) in _csv_rows(path):
            if cls not in known:
                raise DatasetError(
                    f"{path} line {line}: unknown class {cls!r} "
                    f"(no folder images/train/{cls})"
                )
            samples.append(
                _sample(split, split, cls, name, text if text.strip() else None)
            )
    return Listing(
        root=root, samples=samples, classes=classes, source=str(root / "texts")
    )


def _csv_rows(path: Path):
    """Yield (line number, (image_name, text, class_name)) of a titles CSV."""
    try:
        handle = path.open(newline="", encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    with handle:
        reader = csv.reader(handle, strict=True)
        try:
            for row in reader:
                line = reader.line_num
                if line == 1 and [c.strip() for c in row] == CSV_HEADER:
                    continue
                if not row:
                    continue
                if len(row) != 3:
                    raise DatasetError(
                        f"{path} line {line}: expected 3 fields "
                        f"image_name,text,class_name, got {len(row)}"
                    )
                name, text, cls = row
                if not name.strip():
                    raise DatasetError(f"{path} line {line}: empty image_name")
                yield line, (name.strip(), text, cls.strip())
        except csv.Error as exc:
            raise DatasetError(
                f"{path} line {reader.line_num}: malformed CSV: {exc}"
            ) from None
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}: not UTF-8 text ({exc.reason})") from None


def drop_smallest_class(listing: Listing) -> Listing:
    """Drop the class with the fewest training samples (ties: first by name)."""
    counts = Counter(s.class_name for s in listing.samples if s.split == "train")
    smallest = min(listing.classes, key=lambda c: (counts.get(c, 0), c))
    n = counts.get(smallest, 0)
    log.info(
        "food101: dropping class %r (%d training sample%s), the smallest of %d",
        smallest,
        n,
        "s" * (n != 1),
        len(listing.classes),
    )
    return Listing(
        root=listing.root,
        samples=[s for s in listing.samples if s.class_name != smallest],
        classes=[c for c in listing.classes if c != smallest],
        dropped_classes=[smallest],
        source=listing.source,
    )
