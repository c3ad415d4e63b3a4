"""Dataset readers: each lists a dataset folder's samples and classes (torch-free).

`read_dataset(params)` picks the reader named by `data.dataset`:

- `demo`: the folder `pal demo` writes (`pipeline.datasets.demo`)
- `food101`: UPMC-Food101, both layouts (`pipeline.datasets.food101`)
- `n24news`: N24News (`pipeline.datasets.n24news`)
"""

from __future__ import annotations

from pathlib import Path

from pipeline.datasets.base import (
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
    "read_dataset",
]


def read_dataset(params: DataParams) -> Listing:
    """List the samples of the dataset at `params.root`."""
    root = Path(params.root)
    if params.dataset == "demo":
        from pipeline.datasets import demo

        return demo.read(root)
    if params.dataset == "food101":
        from pipeline.datasets import food101

        return food101.read(root)
    if params.dataset == "n24news":
        from pipeline.datasets import n24news

        return n24news.read(root, params.text_field)
    raise DatasetError(f"data.dataset: unknown dataset {params.dataset!r}")
