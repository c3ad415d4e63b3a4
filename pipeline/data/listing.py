"""The samples a dataset lists, before any protocol: what `pal prepare` splits
into tasks and missing tables, and what `pal frozen` embeds once per dataset.

`listed(params)` reads the dataset (`data.dataset` at `data.root`), checks its
ids and texts, keeps `data.per_class` samples of each class and split, and
gives each sample its natural missing-modality code (`pipeline.data.absent`).
It reads `data.dataset`, `data.root`, `data.text_field`, `data.per_class` and
`data.absent` only: the class order, the task split and the missing tables
(`data.seed`, `data.missing_*`, `data.tasks`) play no part.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict

from pipeline.data.absent import natural_codes
from pipeline.data.datasets import DatasetError, Listing, read_dataset
from pipeline.data.samples import text_problem
from pipeline.params import DataParams

log = logging.getLogger(__name__)


def listed(params: DataParams) -> tuple[Listing, list, dict, str]:
    """(listing, kept, absent report, images digest) of the dataset `params`
    names: `natural_codes` of its listing after `check_unique_ids` and
    `per_class`; kept holds (RawSample, natural code, image or None, text)."""
    listing = read_dataset(params)
    check_unique_ids(listing)
    if params.per_class is not None:
        listing = per_class(listing, params.per_class)
    kept, absent, images = natural_codes(listing, params)
    return listing, kept, absent, images


def per_class(listing: Listing, n: int) -> Listing:
    """The listing with at most `n` samples of each (class, split), the first
    by id (`data.per_class`). A multi-label sample counts for each of its
    labels, and each label keeps the samples with the fewest labels first:
    a film of one genre joins that genre's task in every class order, so
    each task keeps samples where the dataset has them."""
    chosen: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for s in listing.samples:
        for name in s.labels or (s.class_name,):
            chosen[(name, s.split)].append((len(s.labels), s.id))
    keep = {i for ranked in chosen.values() for _, i in sorted(ranked)[:n]}
    samples = [s for s in listing.samples if s.id in keep]
    log.info(
        "data.per_class %d: %d of %d samples kept",
        n,
        len(samples),
        len(listing.samples),
    )
    return dataclasses.replace(listing, samples=samples)


def check_unique_ids(listing: Listing) -> None:
    """Ids listed once, and every text field valid Unicode (one line naming
    the file and the row, not a traceback when samples.jsonl is written)."""
    seen: set[str] = set()
    for row, s in enumerate(listing.samples, 1):
        keys = ("id", "class_name", "image", "text")
        fields = [(key, getattr(s, key)) for key in keys]
        for key, value in [*fields, *(("label", name) for name in s.labels)]:
            problem = text_problem(value)
            if problem:
                raise DatasetError(
                    f"{listing.source}: sample {row} ({ascii(s.id)}): {key} {problem}"
                )
        if s.id in seen:
            raise DatasetError(f"{listing.source}: sample id {s.id!r} is listed twice")
        seen.add(s.id)
