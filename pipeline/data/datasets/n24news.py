"""Reader of N24News, in either layout in circulation.

(a) the pre-split release::

    news/nytimes_train.json   a list of articles  (split train)
    news/nytimes_dev.json     a list of articles  (split val)
    news/nytimes_test.json    a list of articles  (split test)
    imgs/<image_id>.jpg

(b) as the dataset's own build script leaves it, without a split::

    nytimes_dataset_full.json  a list of articles
    images/<image_id>.jpg

  The split is drawn here, per section so every section has training
  articles: the section's articles in `image_id` order, shuffled by
  `numpy.random.default_rng([SPLIT_SEED, k])` (k: the section's index in name
  order), 80 % train, 10 % val, the rest test — the 8:1:1 proportions of the
  dataset paper. Same files, same split.

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

import numpy as np

from pipeline.data.datasets.base import (
    DatasetError,
    Listing,
    RawSample,
    expect,
    read_json,
    require_root,
)

FULL = "nytimes_dataset_full.json"
SPLIT_SEED = 24  # layout (b): the seed of the drawn split
SHARES = (0.8, 0.1)  # layout (b): train and val shares; test gets the rest
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
    if (root / "news").is_dir():
        articles = {s: _articles(root / "news" / name) for s, name in FILES.items()}
        paths = {s: root / "news" / name for s, name in FILES.items()}
        images = "imgs"
    elif (root / FULL).is_file():
        articles = _split(_articles(root / FULL))
        paths = dict.fromkeys(articles, root / FULL)
        images = "images"
    else:
        raise DatasetError(
            f"data.root: {root} holds neither news/nytimes_{{train,dev,test}}.json "
            f"(with imgs/) nor {FULL} (with images/), the two N24News layouts"
        )
    classes = sorted({a["section"] for a in articles["train"]})
    known = set(classes)
    samples = []
    for split, items in articles.items():
        path = paths[split]
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
                    image=f"{images}/{image_id}.jpg",
                    text=" ".join(parts) if parts else None,
                )
            )
    source = root / "news" if images == "imgs" else root / FULL
    return Listing(root=root, samples=samples, classes=classes, source=str(source))


def _split(items: list[dict]) -> dict[str, list[dict]]:
    """Layout (b): a seeded 8:1:1 split within each section (module doc)."""
    by_section: dict[str, list[dict]] = {}
    for a in sorted(items, key=lambda a: a["image_id"]):
        by_section.setdefault(a["section"], []).append(a)
    out: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    for k, section in enumerate(sorted(by_section)):
        group = by_section[section]
        order = np.random.default_rng([SPLIT_SEED, k]).permutation(len(group))
        n_train = int(round(SHARES[0] * len(group)))
        n_val = int(round(SHARES[1] * len(group)))
        for rank, i in enumerate(order):
            split = (
                "train"
                if rank < n_train
                else "val"
                if rank < n_train + n_val
                else "test"
            )
            out[split].append(group[i])
    return out


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
