"""A dataset's size as `pal-paper plan` and `submit` price it: its samples
per class and split, counted from its listing by the rule `pal prepare`
follows, never from a hand-kept table.

`dataset_size(params, where)` reads, in this order:

1. the listing at `data.root`, when the folder is there: the dataset's own
   reader (`pipeline.data.datasets`, torch-free) lists it, and the counts
   per class of `train` and `test` are its rows (the real datasets, the
   files layout, the demo once `pal demo` wrote it);
2. for the demo before `pal demo` ran, its params: `demo.n_classes` classes
   of `demo.train_per_class` and `demo.test_per_class` samples;
3. for Food101 and N24News away from their data (a laptop planning a
   cluster's run), the counts prepare made from their full listings,
   recorded under `datasets:` in palpaper/costs.yaml with that commit.

The source is part of the size and `pal-paper plan` prints it. A dataset
none of these sizes is one line naming its folder.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palpaper.overrides import GridError, get

SPLITS = ("train", "test")


@dataclass(frozen=True)
class Size:
    """Samples per class of each split (`per_class[split]`, the classes in
    one fixed order: a count of the train split and the test split for the
    same class share an index), and where the counts came from."""

    names: Sequence[str]
    per_class: Mapping[str, Sequence[float]]
    source: str

    @property
    def classes(self) -> int:
        return len(self.per_class["train"])

    def total(self, split: str, cap: int | None = None) -> float:
        """Samples of `split`, at most `cap` a class (`data.per_class`)."""
        counts = self.per_class[split]
        return float(sum(counts if cap is None else (min(n, cap) for n in counts)))

    def tested(self, tasks: int, seed: int, cap: int | None = None) -> float:
        """Test embeddings of a run's steps: step k embeds the test samples
        of tasks 1..k, the tasks split in prepare's class order (`seed`:
        data.class_order_seed; the first tasks one class more when uneven)."""
        from pipeline.data.protocol import class_order, task_sizes

        counts = dict(zip(self.names, self.per_class["test"], strict=True))
        order = class_order(self.names, seed)
        sizes = task_sizes(len(order), min(tasks, len(order)), allow_uneven=True)
        total, seen, start = 0.0, 0.0, 0
        for n in sizes:
            seen += sum(
                min(counts[c], cap or counts[c]) for c in order[start : start + n]
            )
            total, start = total + seen, start + n
        return total

    def __getitem__(self, key: str) -> float:
        """size["train"], size["test"], size["classes"]: the whole dataset."""
        return self.classes if key == "classes" else self.total(key)

    def report(self) -> dict[str, Any]:
        return {
            "train": round(self.total("train")),
            "test": round(self.total("test")),
            "classes": self.classes,
            "source": self.source,
        }


def dataset_size(params: Mapping[str, Any], where: str) -> Size:
    """The size of the dataset `params` name (`where`: their file)."""
    data = get(params, "data")
    dataset, root = str(data["dataset"]), Path(str(data["root"]))
    if root.is_dir():
        return _listed(data, root)
    if dataset == "demo":
        return _demo(params)
    recorded = _recorded(dataset)
    if recorded is not None:
        return recorded
    raise GridError(
        f"{where}: data.root '{root}': no dataset there to size "
        f"data.dataset '{dataset}' from (put its listing there, or "
        "`pal check` the params it runs with)"
    )


def _listed(data: Mapping[str, Any], root: Path) -> Size:
    """Counts of the listing at `root`, read by the dataset's own reader."""
    from palcore.errors import PalError
    from palcore.params import section_from_mapping
    from pipeline.data.datasets import read_dataset
    from pipeline.params import DataParams

    keys = ("dataset", "root", "text_field", "label_count")
    raw = {k: data[k] for k in keys if k in data}
    try:
        listing = read_dataset(section_from_mapping(DataParams, "data", raw))
    except PalError as e:
        raise GridError(f"sizing the dataset: {e}") from None
    counts = Counter((s.class_name, s.split) for s in listing.samples)
    classes = sorted({name for name, _ in counts})
    per_class = {split: [counts[(c, split)] for c in classes] for split in SPLITS}
    return Size(classes, per_class, f"its listing at {root}")


def _demo(params: Mapping[str, Any]) -> Size:
    """The demo's counts from its params (`pal demo` has not written it)."""
    demo = params.get("demo") or {}
    n = int(demo.get("n_classes", 20))
    train, test = (
        int(demo.get("train_per_class", 40)),
        int(demo.get("test_per_class", 20)),
    )
    per_class = {"train": [train] * n, "test": [test] * n}
    return Size(_names(n), per_class, "the demo's params")


def _recorded(dataset: str) -> Size | None:
    """Prepare's counts of a real dataset's full listing (costs.yaml)."""
    from palpaper.cards import costs

    entry = (costs().get("datasets") or {}).get(dataset)
    if entry is None:
        return None
    n = int(entry["classes"])
    per_class = {split: [entry[split] / n] * n for split in SPLITS}
    return Size(_names(n), per_class, f"palpaper/costs.yaml ({entry['source']})")


def _names(n: int) -> list[str]:
    """Stand-in names of `n` classes of equal counts."""
    return [f"{i:04d}" for i in range(n)]


# a sample's frozen queries: q_t, q_v of the sample and of its two copies,
# ViLT-B/32's hidden size, float32 (the `frozen` stage's file)
FROZEN_BYTES = 3 * 2 * 768 * 4


def caches(dataset: str, size: Size) -> dict[str, Any]:
    """The frozen queries' and the pixel cache's size for `size`'s train and
    test samples: the queries FROZEN_BYTES a sample; the pixels at the bytes
    a photo costs.yaml records for the dataset (`photo_bytes`, with its
    source), None where it records none."""
    from palpaper.cards import costs

    n = size.total("train") + size.total("test")
    entry = (costs().get("datasets") or {}).get(dataset) or {}
    photo = entry.get("photo_bytes")
    return {
        "samples": round(n),
        "frozen_gb": n * FROZEN_BYTES / 1e9,
        "photo_bytes": photo,
        "pixels_gb": None if photo is None else n * float(photo) / 1e9,
        "photo_source": entry.get("photo_source"),
    }
