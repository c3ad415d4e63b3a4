"""Reader of N24News.

Layout::

    news/nytimes_train.json   a list of articles  (split train)
    news/nytimes_dev.json     a list of articles  (split val)
    news/nytimes_test.json    a list of articles  (split test)
    imgs/<image_id>.jpg

An article is an object with `section` (the label, 24 values), `image_id` and the
text fields `headline`, `abstract`, `caption`, `body` (`article` in some
copies). `data.text_field` picks one field or several joined by "+"
(`headline+abstract`); their non-empty values are joined with a space. An
article whose chosen fields are all empty has no text. The classes are the
sections of the training file; a dev/test section not among them is an error.
Sample ids are `<split>/<image_id>`.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.datasets.base import (
    DatasetError,
    Listing,
    RawSample,
    expect,
    read_json,
    require_root,
)

FILES = {
    "train": "nytimes_train.json",
    "val": "nytimes_dev.json",
    "test": "nytimes_test.json",
}
TEXT_FIELDS = ("headline", "abstract", "caption", "body", "article")


def text_fields(text_field: str) -> list[str]:
    """`"headline+abstract"` → `["headline", "abstract"]`; unknown names are errors."""
    fields = [f.strip() for f in text_field.split("+")]
    for f in fields:
        if f not in TEXT_FIELDS:
            raise DatasetError(
                f"data.text_field: unknown field {f!r} in {text_field!r} "
                f"(choose from {', '.join(TEXT_FIELDS)}, joined by '+')"
            )
    return fields


def read(root: Path, text_field: str = "headline") -> Listing:
    """List N24News's samples from `root`, text per `text_field`."""
    require_root(root)
    fields = text_fields(text_field)
    articles = {split: _articles(root / "news" / name) for split, name in FILES.items()}
    classes = sorted({a["section"] for a in articles["train"]})
    known = set(classes)
    samples = []
    for split, items in articles.items():
        path = root / "news" / FILES[split]
        for i, a in enumerate(items):
            if a["section"] not in known:
                raise DatasetError(
                    f"{path}: item {i} has section {a['section']!r}, "
                    "which no training article has"
                )
            parts = []
            for f in fields:
                value = a.get(f)
                if value is None:
                    continue
                expect(isinstance(value, str), path, f"item {i}: '{f}' is not a string")
                if value.strip():
                    parts.append(value.strip())
            image_id = a["image_id"]
            samples.append(
                RawSample(
                    id=f"{split}/{image_id}",
                    split=split,
                    class_name=a["section"],
                    image=f"imgs/{image_id}.jpg",
                    text=" ".join(parts) if parts else None,
                )
            )
    return Listing(
        root=root, samples=samples, classes=classes, source=str(root / "news")
    )


def _articles(path: Path) -> list[dict]:
    items = read_json(path)
    expect(isinstance(items, list), path, "expected a list of articles")
    for i, a in enumerate(items):
        expect(isinstance(a, dict), path, f"item {i} is not an object")
        expect(
            isinstance(a.get("section"), str) and a["section"],
            path,
            f"item {i} has no 'section'",
        )
        image_id = a.get("image_id")
        expect(
            isinstance(image_id, (str, int))
            and not isinstance(image_id, bool)
            and str(image_id) != "",
            path,
            f"item {i} has no 'image_id'",
        )
        a["image_id"] = str(image_id)
    return items
