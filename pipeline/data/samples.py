"""The prepare contract and the batch layout, without torch.

`data/prepare/` holds `samples.jsonl` (one `Sample` per line, keys
`SAMPLE_KEYS`, and `labels` on a multi-label sample's line) and `tasks.json`
(class order, the task split, the params of `data`). `pal prepare` writes
them; `read_prepare` reads and validates them for `pal tune`, `pal extract`
and the loader. `Batch` is what the loader yields and the model consumes.
Missing-modality codes are `palcore.codes.Missing`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from palcore.codes import Missing
from palcore.errors import PalError

if TYPE_CHECKING:
    import torch

SAMPLES_FILE = "samples.jsonl"
TASKS_FILE = "tasks.json"

SPLITS = ("train", "val", "test")


class PrepareError(PalError):
    """samples.jsonl / tasks.json are missing or break their contract."""


@dataclass(frozen=True)
class Sample:
    """One line of samples.jsonl; `missing` is a `Missing` code."""

    id: str
    split: str
    task: int
    label: int
    class_name: str
    image: str | None
    text: str
    missing: int
    # a multi-label sample's labels, sorted, `label` the first (so the
    # others lie in its task's range or later tasks'); () when the sample
    # has one label (the line then has no "labels" key)
    labels: tuple[int, ...] = ()

    def targets(self, end: int) -> tuple[int, ...]:
        """The labels the model learns and is scored on, `end` the end of
        the sample's task's label range: a multi-label sample's labels below
        it (a later task's classes are unknown while its task is learnt),
        else its one label."""
        return tuple(v for v in self.labels if v < end) or (self.label,)


# the keys every samples.jsonl line has, in file order; a multi-label
# sample's line ends with LABELS_KEY too
SAMPLE_KEYS = tuple(f.name for f in dataclasses.fields(Sample))[:-1]
LABELS_KEY = "labels"


@dataclass(frozen=True)
class Tasks:
    """tasks.json: class order, classes per task (1..K), dataset root."""

    class_order: list[str]
    classes_per_task: list[int]
    root: Path
    data: dict[str, Any]
    # the most labels a sample has in a multi-label prepare, 0 for a
    # single-label one (from samples.jsonl: tune learns by BCE, extract
    # writes multi-hot targets, when it is > 0)
    label_width: int = 0

    @property
    def n_tasks(self) -> int:
        return len(self.classes_per_task)

    def end(self, task: int) -> int:
        """The end of task `task`'s label range [start, end) (1-based task)."""
        return sum(self.classes_per_task[:task])

    def record(self) -> dict[str, Any]:
        """What a tune checkpoint keeps of the task split; `multi_label` only
        on a multi-label prepare (`pal predict` then names each row's labels)."""
        out: dict[str, Any] = {
            "class_order": list(self.class_order),
            "classes_per_task": list(self.classes_per_task),
        }
        if self.label_width > 0:
            out["multi_label"] = True
        return out


def read_prepare(
    prepare_dir: str | Path, root: str | Path | None = None
) -> tuple[list[Sample], Tasks]:
    """Read and validate `samples.jsonl` and `tasks.json` of a prepare folder;
    `root` is the dataset's folder (the reader's `data.root`): tasks.json does
    not record it, so that moving the data reruns nothing after prepare."""
    folder = Path(prepare_dir)
    tasks = _read_tasks(folder / TASKS_FILE, root)
    path = folder / SAMPLES_FILE
    if not path.is_file():
        raise PrepareError(f"{path}: not found (run `pal prepare`)")
    bounds, lo = [], 0
    for n in tasks.classes_per_task:
        bounds.append((lo, lo + n))
        lo += n
    samples = []
    with path.open("rb") as f:  # decoded per line: a bad byte names its line
        for line_no, data in enumerate(f, 1):
            where = f"{path}:{line_no}"
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PrepareError(
                    f"{where}: not UTF-8 text (byte {exc.start + 1} of the line)"
                ) from None
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                raise PrepareError(f"{where}: not valid JSON") from None
            samples.append(_sample(raw, where, bounds, tasks.class_order))
    if not samples:
        raise PrepareError(f"{path}: no samples")
    width = max(len(s.labels) for s in samples)
    return samples, dataclasses.replace(tasks, label_width=width)


def _read_tasks(path: Path, root: str | Path | None) -> Tasks:
    if not path.is_file():
        raise PrepareError(f"{path}: not found (run `pal prepare`)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        order = [str(c) for c in raw["class_order"]]
        task_list = sorted(raw["tasks"], key=lambda t: int(t["task"]))
        labels = [list(map(int, t["labels"])) for t in task_list]
        data = dict(raw["data"])
        # an older prepare folder recorded its root; a newer one needs `root`
        root = root if root is not None else data.get("root")
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PrepareError(
            f"{path}: malformed tasks.json ({type(exc).__name__}: {exc})"
        ) from None
    if root is None:
        raise PrepareError(
            f"{path}: names no dataset folder; give the params file whose "
            "data.root holds the images"
        )
    expected, lo = [], 0
    for k, ls in enumerate(labels, 1):
        if int(task_list[k - 1]["task"]) != k or ls != list(range(lo, lo + len(ls))):
            raise PrepareError(
                f"{path}: task {k} must own a contiguous label range starting at {lo}"
            )
        expected.append(len(ls))
        lo += len(ls)
    if lo != len(order) or not expected or min(expected) == 0:
        raise PrepareError(
            f"{path}: tasks cover {lo} labels but class_order has {len(order)} classes"
        )
    return Tasks(order, expected, Path(root), data)


def text_problem(value: Any) -> str | None:
    """None when `value` is text that encodes as UTF-8 (or not text at all:
    its type is checked elsewhere); else what is wrong with it, in words.
    JSON's escapes and Python's `surrogateescape` can make lone surrogates
    (e.g. "\\udcff"), which no UTF-8 writer or tokenizer accepts."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ascii(value[exc.start])[1:-1]
        return f"holds {char} at character {exc.start + 1}, not valid Unicode"
    return None


def _sample(
    raw: Any, where: str, bounds: list[tuple[int, int]], order: list[str]
) -> Sample:
    if not isinstance(raw, dict):
        raise PrepareError(f"{where}: expected a JSON object")
    for key in SAMPLE_KEYS:
        if key not in raw:
            raise PrepareError(f"{where}: missing key '{key}'")
        problem = text_problem(raw[key])
        if problem:
            raise PrepareError(f"{where}: {key} {problem}")
    s = Sample(**{k: raw[k] for k in SAMPLE_KEYS}, labels=_labels(raw, where))
    if s.split not in SPLITS:
        raise PrepareError(f"{where}: split must be one of {SPLITS}, got {s.split!r}")
    if not isinstance(s.task, int) or not 1 <= s.task <= len(bounds):
        raise PrepareError(f"{where}: task must be 1..{len(bounds)}, got {s.task!r}")
    lo, hi = bounds[s.task - 1]
    if not isinstance(s.label, int) or not lo <= s.label < hi:
        raise PrepareError(
            f"{where}: label {s.label!r} is outside task {s.task}'s range [{lo}, {hi})"
        )
    if s.class_name != order[s.label]:
        raise PrepareError(
            f"{where}: class_name {s.class_name!r} is not class_order[{s.label}] "
            f"{order[s.label]!r} (tasks.json)"
        )
    if s.labels and (s.labels[0] != s.label or s.labels[-1] >= len(order)):
        raise PrepareError(
            f"{where}: labels {list(s.labels)} must start at label {s.label} "
            f"and end below {len(order)} (tasks.json's classes)"
        )
    if s.missing not in tuple(Missing):
        raise PrepareError(f"{where}: missing must be 0, 1 or 2, got {s.missing!r}")
    if s.missing != Missing.IMAGE and not s.image:
        raise PrepareError(
            f"{where}: sample {s.id!r} has no image but missing is {s.missing}"
        )
    if not isinstance(s.text, str):
        raise PrepareError(f"{where}: text must be a string")
    return s


def _labels(raw: dict, where: str) -> tuple[int, ...]:
    """A multi-label line's "labels": distinct ints, ascending."""
    if LABELS_KEY not in raw:
        return ()
    value = raw[LABELS_KEY]
    ok = isinstance(value, list) and value and all(type(v) is int for v in value)
    if not ok or value != sorted(set(value)):
        raise PrepareError(
            f"{where}: labels must be a list of distinct labels in ascending "
            f"order, got {value!r}"
        )
    return tuple(value)


def label_sets(samples: Sequence[Sample], width: int, tasks: Tasks) -> np.ndarray:
    """(n, width) int64: each sample's `targets` (its labels of its own
    task's range and earlier), padded with −1: what a multi-label batch
    carries (`Batch.label_sets`) and extract turns into multi-hot rows."""
    out = np.full((len(samples), width), -1, dtype=np.int64)
    for i, s in enumerate(samples):
        t = s.targets(tasks.end(s.task))
        out[i, : len(t)] = t
    return out


def multi_hot(sets: np.ndarray, columns: int) -> np.ndarray:
    """(n, columns) uint8 rows with a 1 at each label of `sets` ((n, L)
    int64, −1 padding) below `columns`."""
    out = np.zeros((len(sets), columns), dtype=np.uint8)
    rows, cols = np.nonzero((sets >= 0) & (sets < columns))
    out[rows, sets[rows, cols]] = 1
    return out


def select(samples: Sequence[Sample], split: str, tasks: Sequence[int]) -> list[Sample]:
    """Samples of `split` whose task is in `tasks`, in file order."""
    wanted = set(tasks)
    return [s for s in samples if s.split == split and s.task in wanted]


@dataclass
class Batch:
    """A collated batch; rows [0, n) are the samples, rows after them (training
    only) are copies of the complete samples: first text-dropped, then
    image-dropped, in the order of `complete`.

    input_ids, attention_mask: (R, T) int64; pixel_values: (R, 3, H, W) float32,
    or uint8 before normalisation (then `norm` is set and `pixel_mask` is None:
    `vision.batch_inputs` normalises on the device); pixel_mask: (R, H, W) int64;
    image_sizes: (R, 2) int64 image heights and widths (None: unknown);
    dummy: (R,) bool rows holding the dummy image; norm: (3, 3) float64
    rescale factor, mean and std per channel; index: (n,) int64 position in
    the dataset; missing: (n,) int64 codes; labels: (n,) int64; complete:
    (c,) int64 positions (in [0, n)) of the complete samples that have
    copies; ids: n sample ids; label_sets: (n, L) int64 a multi-label
    prepare's `label_sets` (None for a single-label one).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    pixel_values: torch.Tensor
    pixel_mask: torch.Tensor | None
    index: torch.Tensor
    missing: torch.Tensor
    labels: torch.Tensor
    complete: torch.Tensor
    ids: list[str]
    image_sizes: torch.Tensor | None = None
    dummy: torch.Tensor | None = None
    norm: torch.Tensor | None = None
    label_sets: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return len(self.ids)

    def pin_memory(self) -> Batch:
        """Page-locked copies of the tensors (DataLoader `pin_memory=True`)."""
        return dataclasses.replace(
            self,
            **{
                f.name: getattr(self, f.name).pin_memory()
                for f in dataclasses.fields(self)
                if f.name != "ids" and getattr(self, f.name) is not None
            },
        )
