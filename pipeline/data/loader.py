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
samples. An unreadable image raises `SampleError` (one line naming the sample
and the file) from the loader's iterator in the main process: a worker only
records it, since an exception raised inside a DataLoader worker comes back
with a multi-line traceback in its message.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from palcore.codes import Missing
from palcore.errors import PalError
from pipeline.data import images
from pipeline.data.samples import Batch, Sample

if TYPE_CHECKING:
    from pipeline.data.pixel_cache import PixelCache


class SampleDataset(Dataset):
    """Items for a list of samples: tokens, one processed image, codes.

    Item: dict(index, input_ids (T,) int64, attention_mask (T,) int64,
    pixel_values (3, h, w) float32, missing, label, id) — or dict(error=str).
    With `uint8` (and a processor that rescales and normalises), pixel_values
    is the resized image as (3, h, w) uint8, normalised later on the device
    (`vision.normalise_pixels`, bit for bit the same), and `dummy` says
    whether it stands for the dummy image. With `pixels` (a pixel cache made
    for this processor), images are read from it instead of decoded: the
    same bytes (`pipeline.data.pixel_cache`). With `label_sets`, an item
    also carries its sample's row of them (`label_set`).
    """

    def __init__(
        self,
        samples: Sequence[Sample],
        root: Path,
        processor,
        max_text_len: int,
        image_side: int,
        draft: bool = True,
        uint8: bool = False,
        pixels: PixelCache | None = None,
        label_sets: np.ndarray | None = None,
    ):
        self.samples = list(samples)
        # (n, L) a multi-label prepare's `samples.label_sets` of the samples,
        # each item's row (batches carry them); None: one label a sample
        self.label_sets = None if label_sets is None else torch.from_numpy(label_sets)
        self.pixels = pixels
        self.root = Path(root)
        self.image_processor = processor.image_processor
        self.image_side = image_side
        self.draft = draft
        if pixels is not None:
            pixels.check(self.image_processor, image_side, draft)
        ip = self.image_processor
        self.uint8 = uint8 and bool(ip.do_rescale and ip.do_normalize)
        texts = ["" if s.missing == Missing.TEXT else s.text for s in self.samples] or [
            ""
        ]
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
        """The dummy image of this dataset's image side, float."""
        return images.dummy_image(self.image_side)

    def dummy_item_image(self) -> torch.Tensor:
        """The dummy image as items carry it: float, or for a uint8 dataset
        (3, side, side) uint8 of 255 (its rows are flagged `dummy` and set to
        1.0 on the device)."""
        if self.uint8:
            side = self.image_side
            return torch.full((3, side, side), 255, dtype=torch.uint8)
        return self.dummy_image()

    def norm(self) -> torch.Tensor:
        """(3, 3) float64: rescale factor, mean and std per channel."""
        ip = self.image_processor
        mean, std = (
            np.broadcast_to(np.asarray(v, np.float64), 3)
            for v in (ip.image_mean, ip.image_std)
        )
        scale = np.full(3, float(ip.rescale_factor))
        return torch.from_numpy(np.stack([scale, mean, std]))

    def __getitem__(self, i: int) -> dict[str, Any]:
        s = self.samples[i]
        if s.missing == Missing.IMAGE:
            pixels = self.dummy_item_image()
        else:
            image = s.image
            assert image is not None, "a sample with its image names its file"
            try:
                pixels = (
                    self._image(self.root / image)
                    if self.pixels is None
                    else self._cached(self.pixels, image)
                )
            except (
                Exception
            ) as exc:  # PIL raises OSError, ValueError, DecompressionBomb…
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                return {
                    "error": f"sample {s.id!r}: cannot read image "
                    f"{self.root / image} ({reason})"
                }
        item = {
            "index": i,
            "input_ids": self.input_ids[i],
            "attention_mask": self.attention_mask[i],
            "pixel_values": pixels,
            "missing": s.missing,
            "label": s.label,
            "id": s.id,
            "dummy": s.missing == Missing.IMAGE,
        }
        if self.label_sets is not None:
            item["label_set"] = self.label_sets[i]
        return item

    def _image(self, path: Path) -> torch.Tensor:
        """(3, h, w): the image at `path` decoded and processed (one decode)."""
        ip, side = self.image_processor, self.image_side
        x = images.decode_resized(path, ip, side, self.draft)
        return self._pixels(x)

    def _cached(self, cache: PixelCache, image: str) -> torch.Tensor:
        """(3, h, w): the image `image` (its path under the root) as the
        pixel cache `cache` holds it, processed as `_image` processes a decode."""
        x = cache.read(image)  # (3, h, w) uint8
        if self.uint8:
            return torch.from_numpy(x)
        x = x.transpose(1, 2, 0)
        return torch.from_numpy(images.normalised(x, self.image_processor))

    def _pixels(self, x: np.ndarray) -> torch.Tensor:
        """(3, h, w) uint8 or float32 of a resized image `x` (h, w, 3) uint8."""
        if self.uint8:
            return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))
        return torch.from_numpy(images.normalised(x, self.image_processor))


class SampleError(PalError):
    """A sample's image cannot be read."""


class Collate:
    """Batch items; with `copies`, append copies of the complete samples."""

    def __init__(self, dataset: SampleDataset, copies: bool):
        self.copies = copies
        self.empty_ids, self.empty_mask = dataset.empty_ids, dataset.empty_mask
        self.dummy = dataset.dummy_item_image()
        self.norm = dataset.norm() if dataset.uint8 else None

    def __call__(self, items: list[dict[str, Any]]) -> Batch | str:
        """The batch, or the first item's error line (raised by `Batches`)."""
        for it in items:
            if "error" in it:
                return it["error"]
        comp = (
            [i for i, it in enumerate(items) if it["missing"] == Missing.COMPLETE]
            if self.copies
            else []
        )
        c = len(comp)
        images = (
            [it["pixel_values"] for it in items]
            + [items[i]["pixel_values"] for i in comp]
            + [self.dummy] * c
        )
        dummy = [it["dummy"] for it in items] + [False] * c + [True] * c
        pixel_values, pixel_mask = self._pad(images)
        id_rows = (
            [it["input_ids"] for it in items]
            + [self.empty_ids] * c
            + [items[i]["input_ids"] for i in comp]
        )
        mask_rows = (
            [it["attention_mask"] for it in items]
            + [self.empty_mask] * c
            + [items[i]["attention_mask"] for i in comp]
        )
        ids, am = torch.stack(id_rows), torch.stack(mask_rows)
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
            image_sizes=torch.tensor([p.shape[1:] for p in images], dtype=torch.int64),
            dummy=torch.tensor(dummy, dtype=torch.bool),
            norm=self.norm,
            label_sets=(
                torch.stack([it["label_set"] for it in items])
                if "label_set" in items[0]
                else None
            ),
        )

    def _pad(self, images: list[torch.Tensor]) -> tuple[torch.Tensor, Any]:
        """Images padded to the largest height and width: (R, 3, H, W) in their
        dtype, and for float images the (R, H, W) int64 mask (uint8 images:
        None, the mask is built on the device from the sizes)."""
        H = max(p.shape[1] for p in images)
        W = max(p.shape[2] for p in images)
        pixel_values = torch.zeros(len(images), 3, H, W, dtype=images[0].dtype)
        for r, p in enumerate(images):
            pixel_values[r, :, : p.shape[1], : p.shape[2]] = p
        if self.norm is not None:
            return pixel_values, None
        pixel_mask = torch.zeros(len(images), H, W, dtype=torch.int64)
        for r, p in enumerate(images):
            pixel_mask[r, : p.shape[1], : p.shape[2]] = 1
        return pixel_values, pixel_mask


class WaitClock:
    """Iterates `batches`, adding up in `seconds` the time spent waiting for
    each next one: how long the loop (and so the GPU) waited for the loader."""

    def __init__(self, batches: Any) -> None:
        self.batches = batches
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.batches)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.seconds += time.perf_counter() - t0
            yield batch


class Batches:
    """The batches of a DataLoader; raises `SampleError` for an unreadable
    image. `len()` is the number of batches."""

    def __init__(self, loader: DataLoader):
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.loader:
            if isinstance(batch, str):
                raise SampleError(batch)
            yield batch


def make_loader(
    dataset: SampleDataset,
    batch_size: int,
    *,
    copies: bool = False,
    shuffle: bool = False,
    seed: int = 0,
    num_workers: int = 0,
    device: torch.device | None = None,
    batch_sampler: Sequence[Sequence[int]] | None = None,
) -> Batches:
    """Batches of `dataset` from a DataLoader; shuffling is seeded by `seed`
    (same order on every run), pinned memory on CUDA. `batch_sampler`: the
    batches' dataset indices, in order (instead of `batch_size`, `shuffle`)."""
    generator = torch.Generator().manual_seed(seed) if shuffle else None
    cuda = device is not None and device.type == "cuda"
    sizes = (
        {"batch_sampler": batch_sampler}
        if batch_sampler is not None
        else {"batch_size": batch_size, "shuffle": shuffle, "generator": generator}
    )
    loader = DataLoader(
        dataset,
        **sizes,
        num_workers=num_workers,
        collate_fn=Collate(dataset, copies),
        pin_memory=cuda,
        # workers live as long as the loader: one start per stage part, not
        # one per epoch
        persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers else None,
    )
    return Batches(loader)


def index_batches(
    labels: torch.Tensor,
    batch_size: int,
    seed: int,
    epoch: int,
    label_sets: torch.Tensor | None = None,
) -> Iterator[Batch]:
    """Batches of indices and labels only (the head-only run of
    `prompt.enabled: false` trains on cached queries, no images needed);
    `label_sets` (n, L): a multi-label prepare's, sliced like the labels."""
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = torch.randperm(len(labels), generator=g)
    empty = torch.zeros(0, dtype=torch.int64)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        yield Batch(
            input_ids=empty,
            attention_mask=empty,
            pixel_values=empty,
            pixel_mask=empty,
            index=idx,
            missing=torch.zeros_like(idx),
            labels=labels[idx],
            complete=empty,
            ids=[""] * len(idx),
            label_sets=None if label_sets is None else label_sets[idx],
        )
