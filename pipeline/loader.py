"""From `data/prepare/` to batches: samples.jsonl → Dataset → DataLoader.

`read_prepare(dir)` reads and validates `samples.jsonl` and `tasks.json`.
`SampleDataset` tokenises all texts once (padded to `model.max_text_len`) and
decodes/resizes/normalises one image per item with the backbone's
`ViltProcessor` image processor, so the expensive part runs in DataLoader
workers. Missing text → the empty string; missing image → an all-white image,
1.0 after ViLT's normalisation, of `image_side`² pixels (DESIGN §5).

`Collate` pads images to the batch's largest height/width (with `pixel_mask`)
and texts to the batch's longest (at most `max_text_len`) and, for training,
appends the text-dropped and image-dropped copies of the batch's complete
samples. An unreadable image does not raise inside a worker
(that would print a multi-line traceback); the batch becomes the error line,
which `model.check_batch` raises in the main process.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from pipeline.model import Batch
from solver.errors import PalError

SPLITS = ("train", "val", "test")
SAMPLE_KEYS = ("id", "split", "task", "label", "class_name", "image", "text", "missing")


class PrepareError(PalError):
    """samples.jsonl / tasks.json are missing or break their contract."""


@dataclass(frozen=True)
class Sample:
    """One line of samples.jsonl. missing: 0 complete, 1 text, 2 image missing."""

    id: str
    split: str
    task: int
    label: int
    class_name: str
    image: str | None
    text: str
    missing: int


@dataclass(frozen=True)
class Tasks:
    """tasks.json: class order, classes per task (1..K), dataset root."""

    class_order: list[str]
    classes_per_task: list[int]
    root: Path
    data: dict[str, Any]

    @property
    def n_tasks(self) -> int:
        return len(self.classes_per_task)

    def record(self) -> dict[str, Any]:
        """What a tune checkpoint keeps of the task split."""
        return {
            "class_order": list(self.class_order),
            "classes_per_task": list(self.classes_per_task),
        }


def read_prepare(prepare_dir: str | Path) -> tuple[list[Sample], Tasks]:
    """Read and validate `samples.jsonl` and `tasks.json` of a prepare folder."""
    folder = Path(prepare_dir)
    tasks = _read_tasks(folder / "tasks.json")
    path = folder / "samples.jsonl"
    if not path.is_file():
        raise PrepareError(f"{path}: not found (run `pal prepare`)")
    bounds, lo = [], 0
    for n in tasks.classes_per_task:
        bounds.append((lo, lo + n))
        lo += n
    samples = []
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                raise PrepareError(f"{where}: not valid JSON") from None
            samples.append(_sample(raw, where, bounds))
    if not samples:
        raise PrepareError(f"{path}: no samples")
    return samples, tasks


def _read_tasks(path: Path) -> Tasks:
    if not path.is_file():
        raise PrepareError(f"{path}: not found (run `pal prepare`)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        order = [str(c) for c in raw["class_order"]]
        task_list = sorted(raw["tasks"], key=lambda t: int(t["task"]))
        labels = [list(map(int, t["labels"])) for t in task_list]
        data = dict(raw["data"])
        root = Path(data["root"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PrepareError(
            f"{path}: malformed tasks.json ({type(exc).__name__}: {exc})"
        ) from None
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
    return Tasks(order, expected, root, data)


def _sample(raw: Any, where: str, bounds: list[tuple[int, int]]) -> Sample:
    if not isinstance(raw, dict):
        raise PrepareError(f"{where}: expected a JSON object")
    for key in SAMPLE_KEYS:
        if key not in raw:
            raise PrepareError(f"{where}: missing key '{key}'")
    s = Sample(**{k: raw[k] for k in SAMPLE_KEYS})
    if s.split not in SPLITS:
        raise PrepareError(f"{where}: split must be one of {SPLITS}, got {s.split!r}")
    if not isinstance(s.task, int) or not 1 <= s.task <= len(bounds):
        raise PrepareError(f"{where}: task must be 1..{len(bounds)}, got {s.task!r}")
    lo, hi = bounds[s.task - 1]
    if not isinstance(s.label, int) or not lo <= s.label < hi:
        raise PrepareError(
            f"{where}: label {s.label!r} is outside task {s.task}'s range [{lo}, {hi})"
        )
    if s.missing not in (0, 1, 2):
        raise PrepareError(f"{where}: missing must be 0, 1 or 2, got {s.missing!r}")
    if s.missing != 2 and not s.image:
        raise PrepareError(
            f"{where}: sample {s.id!r} has no image but missing is {s.missing}"
        )
    if not isinstance(s.text, str):
        raise PrepareError(f"{where}: text must be a string")
    return s


def select(samples: Sequence[Sample], split: str, tasks: Sequence[int]) -> list[Sample]:
    """Samples of `split` whose task is in `tasks`, in file order."""
    wanted = set(tasks)
    return [s for s in samples if s.split == split and s.task in wanted]


def dummy_image(side: int) -> torch.Tensor:
    """(3, side, side) of 1.0: an all-white image after ViLT's normalisation."""
    return torch.ones(3, side, side)


class SampleDataset(Dataset):
    """Items for a list of samples: tokens, one processed image, codes.

    Item: dict(index, input_ids (T,) int64, attention_mask (T,) int64,
    pixel_values (3, h, w) float32, missing, label, id) — or dict(error=str).
    """

    def __init__(
        self,
        samples: Sequence[Sample],
        root: Path,
        processor,
        max_text_len: int,
        image_side: int,
    ):
        self.samples = list(samples)
        self.root = Path(root)
        self.image_processor = processor.image_processor
        self.image_side = image_side
        texts = ["" if s.missing == 1 else s.text for s in self.samples] or [""]
        tok = processor.tokenizer(
            texts,
            padding="max_length",
            max_length=max_text_len,
            truncation=True,
            return_tensors="pt",
        )
        self.input_ids = tok["input_ids"]
        self.attention_mask = tok["attention_mask"]
        empty = processor.tokenizer(
            [""],
            padding="max_length",
            max_length=max_text_len,
            truncation=True,
            return_tensors="pt",
        )
        self.empty_ids, self.empty_mask = (
            empty["input_ids"][0],
            empty["attention_mask"][0],
        )

    def __len__(self) -> int:
        return len(self.samples)

    def dummy_image(self) -> torch.Tensor:
        """The dummy image of this dataset's image side (`dummy_image`)."""
        return dummy_image(self.image_side)

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = self.samples[i]
        if s.missing == 2:
            pixels = self.dummy_image()
        else:
            try:
                pixels = self._image(self.root / s.image)
            except (
                Exception
            ) as exc:  # PIL raises OSError, ValueError, DecompressionBomb…
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                return {
                    "error": f"sample {s.id!r}: cannot read image "
                    f"{self.root / s.image} ({reason})"
                }
        return {
            "index": i,
            "input_ids": self.input_ids[i],
            "attention_mask": self.attention_mask[i],
            "pixel_values": pixels,
            "missing": s.missing,
            "label": s.label,
            "id": s.id,
        }

    def _image(self, path: Path) -> torch.Tensor:
        from PIL import Image

        with Image.open(path) as im:
            rgb = im.convert("RGB")
        out = self.image_processor(images=rgb, return_tensors="np", do_pad=False)
        return torch.from_numpy(np.ascontiguousarray(out["pixel_values"][0]))


class Collate:
    """Batch items; with `copies`, append copies of the complete samples."""

    def __init__(self, dataset: SampleDataset, copies: bool):
        self.copies = copies
        self.empty_ids, self.empty_mask = dataset.empty_ids, dataset.empty_mask
        self.dummy = dataset.dummy_image()

    def __call__(self, items: list[dict[str, Any]]) -> Batch | str:
        for it in items:
            if "error" in it:
                return it["error"]
        comp = (
            [i for i, it in enumerate(items) if it["missing"] == 0]
            if self.copies
            else []
        )
        c = len(comp)
        images = (
            [it["pixel_values"] for it in items]
            + [items[i]["pixel_values"] for i in comp]
            + [self.dummy] * c
        )
        H = max(p.shape[1] for p in images)
        W = max(p.shape[2] for p in images)
        pixel_values = torch.zeros(len(images), 3, H, W)
        pixel_mask = torch.zeros(len(images), H, W, dtype=torch.int64)
        for r, p in enumerate(images):
            pixel_values[r, :, : p.shape[1], : p.shape[2]] = p
            pixel_mask[r, : p.shape[1], : p.shape[2]] = 1
        ids = (
            [it["input_ids"] for it in items]
            + [self.empty_ids] * c
            + [items[i]["input_ids"] for i in comp]
        )
        am = (
            [it["attention_mask"] for it in items]
            + [self.empty_mask] * c
            + [items[i]["attention_mask"] for i in comp]
        )
        ids, am = torch.stack(ids), torch.stack(am)
        # pad text only to the batch's longest: padded keys are masked, so this
        # changes nothing but float noise, and saves most of the text tokens
        T = int(am.sum(1).max())
        return Batch(
            input_ids=ids[:, :T].contiguous(),
            attention_mask=am[:, :T].contiguous(),
            pixel_values=pixel_values,
            pixel_mask=pixel_mask,
            index=torch.tensor([it["index"] for it in items]),
            missing=torch.tensor([it["missing"] for it in items]),
            labels=torch.tensor([it["label"] for it in items]),
            complete=torch.tensor(comp, dtype=torch.int64),
            ids=[it["id"] for it in items],
        )


def make_loader(
    dataset: SampleDataset,
    batch_size: int,
    *,
    copies: bool = False,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    device: torch.device | None = None,
) -> DataLoader:
    """A DataLoader over `dataset`; shuffling is seeded by `seed` (same order on
    every run), pinned memory on CUDA."""
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    cuda = device is not None and device.type == "cuda"
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        generator=generator,
        num_workers=num_workers,
        collate_fn=Collate(dataset, copies),
        pin_memory=cuda,
        persistent_workers=False,
        prefetch_factor=4 if num_workers else None,
    )
