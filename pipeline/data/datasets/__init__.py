"""Dataset readers: each lists a dataset folder's samples and classes (torch-free).

`read_dataset(params)` calls the reader `READERS` names for `data.dataset`:

- `demo`: the folder `pal demo` writes (`pipeline.data.datasets.demo`)
- `food101`: UPMC-Food101, both layouts (`pipeline.data.datasets.food101`)
- `n24news`: N24News (`pipeline.data.datasets.n24news`)
- `mmimdb`: MM-IMDb, multi-label (`pipeline.data.datasets.mmimdb`)
- `files`: a listing (JSONL or CSV) beside the images, a layout anyone can
  write (`pipeline.data.datasets.files`)

The names are `pipeline.params.Dataset`, a Literal: params loading checks
`data.dataset` against it without importing a reader, and the type checker
holds `READERS`' keys to it (tests/test_readers.py checks that every name has
a reader).
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pipeline.data.datasets import demo, files, food101, mmimdb, n24news
from pipeline.data.datasets.base import (
    DatasetError,
    FileIndex,
    Listing,
    RawSample,
)
from pipeline.params import DataParams, Dataset

__all__ = [
    "READERS",
    "DatasetError",
    "FileIndex",
    "Listing",
    "RawSample",
    "Reader",
    "read_dataset",
]


class Reader(Protocol):
    """Lists the dataset at `root`, reading the `data` keys it needs."""

    def __call__(self, root: Path, params: DataParams, /) -> Listing: ...


READERS: dict[Dataset, Reader] = {
    "demo": lambda root, params: demo.read(root),
    "food101": lambda root, params: food101.read(root),
    "n24news": lambda root, params: n24news.read(root, params.text_field),
    "mmimdb": lambda root, params: mmimdb.read(root, params.label_count),
    "files": lambda root, params: files.read(root),
}


def read_dataset(params: DataParams) -> Listing:
    """List the samples of the dataset at `params.root`."""
    return READERS[params.dataset](Path(params.root), params)
