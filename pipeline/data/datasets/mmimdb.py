"""MM-IMDb as released (mmimdb.tar.gz), read without torch: the films, their
genres (several per film), their poster and their plot.

The archive unpacks to a folder `mmimdb/`, the root here::

    split.json            {"train": [ids], "dev": [ids], "test": [ids]}
    dataset/<id>.json     the film's metadata
    dataset/<id>.jpeg     its poster

What the public code that prepares the dataset shows:

- Layout. The dataset's crawler writes `mmimdb/dataset/<id>.json` and
  `<id>.jpeg` (johnarevalo/gmu-mmimdb `get_data.py:25-26`; the README's
  `mmimdb.tar.gz`, `README.md:16`, and `ls dataset/*.json`, `:23`); MMBT reads
  `mmimdb/split.json`, `mmimdb/dataset/{id}.json` and names the image
  `mmimdb/dataset/{id}.jpeg` (facebookresearch/mmbt `scripts/mmimdb.py:19,24,
  30`). The missing-aware-prompts code reads the same `split.json` after
  moving the files into `images/` and `labels/` (YiLunLee/missing_aware_prompts
  `DATA.md:9-17`, `vilt/utils/write_mmimdb.py:20-23,31-32`); RebQ starts from
  that copy, re-listed in its own `MM-IMDB-CMML.json` (Tree-Shu-Zhao/RebQ.pytorch
  `README.md:33-39`, `src/data/builder.py:107,126`).
- split.json. The keys are `train`, `dev` and `test`; `dev` is the validation
  split (missing_aware_prompts `vilt/datasets/mmimdb_dataset.py:13-14`). The copy
  in missing_aware_prompts (`datasets/mmimdb/split.json`) lists 15552, 2608
  and 7799 films, 25959 in all, none twice; every id is a JSON string of seven
  digits, IMDb's number with its leading zeros (`0000005` … `4530184`; the
  dataset stores them as 7-byte strings, gmu-mmimdb `make_dataset.py:138`).
  An id read as a number would lose its zeros, so ids must be digit strings.
- The film's JSON is every key IMDbPY returned for it (`get_data.py:31-37`),
  among them `genres`, a list of genre names, and `plot`, a list of plot
  texts. A film the crawler found no poster for has a JSON and no JPEG
  (`get_data.py:38-44`).
- Genres. The 23 are the most frequent ones (`make_dataset.py:77-79`, with
  `n_classes: 23` in `gmu.json`), listed in `GENRES`' order, most frequent
  first, by missing_aware_prompts (`vilt/utils/write_mmimdb.py:13-15`), whose
  multi-hot label follows that order (`:46`). Some films also carry one of
  four rarer IMDb genres, `EXTRA_GENRES` (News 64 films, Adult 4, Talk-Show
  2, Reality-TV 1, as counted in jperezrua/mfas issue #9), which that label
  leaves out and for which MMBT drops the film (`scripts/mmimdb.py:32`).
  RebQ's config keeps 20 labels in 5 tasks of 4
  (`configs/data/mm_imdb_cmml.yaml:13-15`).
- Plot. The dataset's authors and MMBT take the longest plot, the first of
  equally long ones (`make_dataset.py:51`, `scripts/mmimdb.py:26,29`);
  missing_aware_prompts pairs the poster with each plot in turn, or with the
  first alone (`vilt/utils/write_mmimdb.py:40-43`).

Here: a `Film` per id of split.json, `split` train | val | test (`dev` is
val), sorted by split in that order, then by id. `genres` are the film's
genres among the 23, as the JSON lists them; `EXTRA_GENRES` are left out,
any other name is an error. `image` is `dataset/<id>.jpeg`, or None when the
file is absent (checked with one listing of `dataset/`); `text` is the
longest plot as written, or None when the film has no `plot`, an empty list
or a blank longest plot. A missing image or text is the dataset's own missing
modality. Everything else is refused in one line naming the file (and the
film): a missing root, split.json or film JSON; malformed JSON or not UTF-8;
split.json not an object of the three splits, each a list of digit-string
ids; an id listed twice; a film without genres or with a genre outside
both lists; `genres` or `plot` not a list of strings. A genre the JSON
lists twice counts once.

`read` lists the films as multi-label samples for `pal prepare`: every genre
kept is a class (`data.label_count` keeps the most frequent ones of the
training split: RebQ's 20), and `pipeline.data.protocol.assign_multilabel`
puts each film in one task.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from pathlib import Path
from typing import Any

from pipeline.data.datasets.base import (
    DatasetError,
    FileIndex,
    Listing,
    RawSample,
    expect,
    read_json,
    require_root,
)
from pipeline.data.samples import SPLITS

log = logging.getLogger(__name__)

SPLIT_FILE = "split.json"
FILMS = "dataset"  # the folder of <id>.json and <id>.jpeg
RELEASE_SPLITS = {"train": "train", "dev": "val", "test": "test"}  # file → ours

GENRES = (
    "Drama",
    "Comedy",
    "Romance",
    "Thriller",
    "Crime",
    "Action",
    "Adventure",
    "Horror",
    "Documentary",
    "Mystery",
    "Sci-Fi",
    "Fantasy",
    "Family",
    "Biography",
    "War",
    "History",
    "Music",
    "Animation",
    "Musical",
    "Western",
    "Sport",
    "Short",
    "Film-Noir",
)
EXTRA_GENRES = ("News", "Adult", "Talk-Show", "Reality-TV")  # in the files, unused


@dataclasses.dataclass(frozen=True, slots=True)
class Film:
    """One film of split.json."""

    id: str  # IMDb's number, seven digits with leading zeros
    split: str  # train | val | test
    genres: tuple[str, ...]  # among GENRES, in the JSON's order; never empty
    image: str | None  # "dataset/<id>.jpeg"; None: no poster in the release
    text: str | None  # the longest plot; None: the film has no plot


def read_films(root: Path) -> list[Film]:
    """The films of the MM-IMDb release at `root`, by split then id (module doc)."""
    require_root(root)
    splits = _splits(root / SPLIT_FILE)
    index = FileIndex(root)
    films = []
    for split, ids in splits.items():
        for ident in sorted(ids):
            path = root / FILMS / f"{ident}.json"
            image = f"{FILMS}/{ident}.jpeg"
            genres, text = _film(path, ident, read_json(path))
            films.append(
                Film(
                    id=ident,
                    split=split,
                    genres=genres,
                    image=image if index.exists(image) else None,
                    text=text,
                )
            )
    return films


def read(root: Path, label_count: int | None = None) -> Listing:
    """MM-IMDb's films as multi-label samples (`RawSample.labels`, the
    film's genres kept, in the JSON's order; `class_name` the first). With
    `label_count` (`data.label_count`), the genres kept are the
    `label_count` most frequent in the training split (ties: `GENRES`'
    order); the others are dropped from every film, and a film left without
    a genre is dropped (logged). Sample ids are the films' ids."""
    films = read_films(root)
    counts = Counter(g for f in films if f.split == "train" for g in f.genres)
    ranked = sorted(GENRES, key=lambda g: (-counts[g], GENRES.index(g)))
    n = len(GENRES) if label_count is None else label_count
    if not 0 < n <= len(GENRES):
        raise DatasetError(
            f"data.label_count: must be 1..{len(GENRES)} (MM-IMDb's genres), got {n}"
        )
    kept = set(ranked[:n])
    samples, lost = [], 0
    for f in films:
        genres = tuple(g for g in f.genres if g in kept)
        if not genres:
            lost += 1
            continue
        samples.append(RawSample(f.id, f.split, genres[0], f.image, f.text, genres))
    if lost:
        log.info(
            "data.label_count %d: %d films have none of the genres kept; dropped",
            n,
            lost,
        )
    return Listing(
        root=root,
        samples=samples,
        classes=sorted(kept),
        dropped_classes=sorted(set(GENRES) - kept),
        source=str(root / SPLIT_FILE),
    )


def _splits(path: Path) -> dict[str, list[str]]:
    """split.json as {train|val|test: ids}; its faults named by the file."""
    doc = read_json(path)
    names = ", ".join(RELEASE_SPLITS)
    expect(
        isinstance(doc, dict),
        path,
        f"expected an object mapping {names} to lists of film ids",
    )
    for key in doc:
        expect(key in RELEASE_SPLITS, path, f"unknown split {key!r} (use {names})")
    first: dict[str, str] = {}  # id -> the split that listed it
    out: dict[str, list[str]] = {split: [] for split in SPLITS}
    for key, split in RELEASE_SPLITS.items():
        expect(key in doc, path, f"no {key!r} split (it needs {names})")
        ids = doc[key]
        expect(isinstance(ids, list), path, f"{key!r} is not a list of film ids")
        for i, ident in enumerate(ids):
            expect(
                isinstance(ident, str) and ident.isascii() and ident.isdigit(),
                path,
                f"{key!r} item {i} is {ident!r}, not a film id (a string of digits)",
            )
            if ident in first:
                where = (
                    f"twice in {key!r}"
                    if first[ident] == key
                    else f"in {first[ident]!r} and in {key!r}"
                )
                raise DatasetError(f"{path}: film {ident!r} is listed {where}")
            first[ident] = key
            out[split].append(ident)
    return out


def _film(path: Path, ident: str, doc: Any) -> tuple[tuple[str, ...], str | None]:
    """(genres among the 23, longest plot or None) of the film's JSON."""
    film = f"film {ident!r}"
    expect(isinstance(doc, dict), path, f"{film}: expected a JSON object")
    expect("genres" in doc, path, f"{film} has no 'genres'")
    genres = doc["genres"]
    expect(_strings(genres), path, f"{film}: 'genres' is not a list of strings")
    expect(len(genres) > 0, path, f"{film} has an empty 'genres' list")
    for g in genres:
        expect(
            g in GENRES or g in EXTRA_GENRES,
            path,
            f"{film} has genre {g!r}, which is none of the 23 MM-IMDb genres",
        )
    kept = tuple(dict.fromkeys(g for g in genres if g in GENRES))  # once each
    expect(
        len(kept) > 0,
        path,
        f"{film} has none of the 23 MM-IMDb genres (only {', '.join(genres)})",
    )
    plots = doc.get("plot")
    if plots is None:
        return kept, None
    expect(_strings(plots), path, f"{film}: 'plot' is not a list of strings")
    longest = max(plots, key=len, default="")
    return kept, longest if longest.strip() else None


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)
