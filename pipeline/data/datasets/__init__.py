"""Dataset readers: each lists a dataset folder's samples and classes (torch-free).

`read_dataset(params)` picks the reader named by `data.dataset`:

- `demo`: the folder `pal demo` writes (`pipeline.data.datasets.demo`)
- `food101`: UPMC-Food101, both layouts (`pipeline.data.datasets.food101`)
- `n24news`: N24News (`pipeline.data.datasets.n24news`)
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from pathlib import Path

from pipeline.data.datasets.base import (
    DatasetError,
    FileIndex,
    Listing,
    RawSample,
)
from pipeline.params import DataParams

__all__ = [
    "DatasetError",
    "FileIndex",
    "Listing",
    "RawSample",
    "per_class",
    "read_dataset",
]

log = logging.getLogger(__name__)


def read_dataset(params: DataParams) -> Listing:
    """List the samples of the dataset at `params.root`."""
    root = Path(params.root)
    if params.dataset == "demo":
        from pipeline.data.datasets import demo

        return demo.read(root)
    if params.dataset == "food101":
        from pipeline.data.datasets import food101

        return food101.read(root)
    if params.dataset == "n24news":
        from pipeline.data.datasets import n24news

        return n24news.read(root, params.text_field)
    raise DatasetError(f"data.dataset: unknown dataset {params.dataset!r}")


def per_class(listing: Listing, n: int) -> Listing:
    """The listing with at most `n` samples of each (class, split), the first
    by id (`data.per_class`)."""
    chosen: dict[tuple[str, str], list[str]] = defaultdict(list)
    for s in listing.samples:
        chosen[(s.class_name, s.split)].append(s.id)
    keep = {i for ids in chosen.values() for i in sorted(ids)[:n]}
    samples = [s for s in listing.samples if s.id in keep]
    log.info(
        "data.per_class %d: %d of %d samples kept",
        n,
        len(samples),
        len(listing.samples),
    )
    return dataclasses.replace(listing, samples=samples)
