"""The prompted joint embedding of samples: the forward of `pal extract` and
`pal predict` (DESIGN §5).

Samples are loaded in batches (`pipeline.data.loader`), embedded by the model of a
step (`PalModel.features`: the prompted text CLS after the final LayerNorm,
with PAL's reconstruction for a missing modality) and scored by its BP head.
ViLT draws the patch order from torch's RNG, so the RNG is reseeded per batch
from the batch's index: the same batches give the same bytes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from palcore.progress import tqdm
from pipeline import params as pparams
from pipeline.data.loader import SampleDataset, WaitClock, make_loader
from pipeline.data.pixel_cache import PixelCache
from pipeline.data.samples import Batch, Sample
from pipeline.model.device import autocast
from pipeline.model.network import PalModel

log = logging.getLogger(__name__)


def embed_samples(
    model: PalModel,
    samples: list[Sample],
    root: Path,
    params: pparams.ExtractParams,
    desc: str = "extract",
    first_batch: int = 0,
    queries: np.ndarray | None = None,
    batches: Iterable[Batch] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Joint embeddings (n, D) float32 and head logits (n, C_k) float32 of
    `samples` (image paths relative to `root`), in order. Also the forward of
    `pal predict`. `queries` (n, 2, D) float32: the samples' stored frozen
    queries (`pal frozen`; None: the frozen pass runs here); a model without
    prompts then needs no image and no forward. `batches`: the samples'
    batches, in order, from a loader shared with other calls
    (`StepLoader.part`); None: a loader of their own."""
    backbone = model.backbone
    D, C = backbone.hidden_size, sum(model.classes_per_task[: model.step])
    if not samples:
        return np.zeros((0, D), np.float32), np.zeros((0, C), np.float32)
    device = backbone.device
    q_all = None if queries is None else torch.from_numpy(queries).to(device)
    if q_all is not None and model.prompts is None:
        return _gathered(model, q_all)
    if batches is None:
        dataset = _dataset(samples, root, backbone)
        batches = make_loader(
            dataset, params.batch_size, num_workers=params.num_workers, device=device
        )
    return _forward(model, batches, q_all, len(samples), first_batch, desc)


def _gathered(model: PalModel, q_all: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Without prompts, the joint embeddings of stored frozen queries: no
    image and no forward of the backbone."""
    with torch.inference_mode(), autocast(model.backbone.device):
        x, logits = model.features(None, q_all)
    return x.float().cpu().numpy(), logits.float().cpu().numpy()


def _forward(
    model: PalModel,
    batches: Iterable[Batch],
    q_all: torch.Tensor | None,
    n: int,
    first_batch: int,
    desc: str,
) -> tuple[np.ndarray, np.ndarray]:
    """The prompted forward over `batches` (n samples in order), each batch
    seeded by its index from `first_batch`, with a progress bar and one line
    of where the time went."""
    xs, ls, done = [], [], 0
    clock, t0 = WaitClock(batches), time.perf_counter()
    with (
        torch.inference_mode(),
        autocast(model.backbone.device),
        tqdm(total=n, desc=desc, unit="sample", disable=None, leave=False) as bar,
    ):
        for b, batch in enumerate(clock):
            # ViLT's patch order: the same batch gets the same seed, and bytes
            torch.manual_seed(first_batch + b)
            # the batches walk the samples in order (a shared loader's
            # batch.index counts in its union of steps, not in `samples`)
            q = None if q_all is None else q_all[done : done + batch.n]
            done += batch.n
            x, logits = model.features(batch, q)
            xs.append(x.float())
            ls.append(logits.float())
            bar.update(batch.n)
    log.info(
        "%s: %d samples in %.1f s, %.1f s of it waiting for data",
        desc,
        n,
        time.perf_counter() - t0,
        clock.seconds,
    )
    return torch.cat(xs).cpu().numpy(), torch.cat(ls).cpu().numpy()


def _dataset(
    samples: list[Sample], root: Path, backbone, pixels: PixelCache | None = None
) -> SampleDataset:
    return SampleDataset(
        samples,
        root,
        backbone.processor,
        backbone.max_text_len,
        backbone.image_side,
        uint8=True,  # normalised on the device, same bits
        pixels=pixels,
    )


class StepLoader:
    """One DataLoader for the sample lists of several steps, so its workers
    start once per stage, not once per step: a dataset over the lists' union
    (each sample once, by id) and a batch sampler that walks each list in
    order in batches of `batch_size`, the same batches a loader of each list
    makes. `part(k)` yields list k's batches; call it for k = 0, 1, … in turn
    and consume each fully."""

    def __init__(
        self,
        parts: list[list[Sample]],
        root: Path,
        backbone,
        params: pparams.ExtractParams,
        pixels: PixelCache | None = None,
    ):
        index: dict[str, int] = {}
        union: list[Sample] = []
        batches: list[list[int]] = []
        self.n_batches: list[int] = []
        bs = params.batch_size
        for part in parts:
            rows = []
            for s in part:
                if s.id not in index:
                    index[s.id] = len(union)
                    union.append(s)
                rows.append(index[s.id])
            batches += [rows[i : i + bs] for i in range(0, len(rows), bs)]
            self.n_batches.append(-(-len(rows) // bs))
        self.dataset = _dataset(union, root, backbone, pixels)
        self.loader = make_loader(
            self.dataset,
            bs,
            num_workers=params.num_workers,
            device=backbone.device,
            batch_sampler=batches,
        )
        self._it: Iterator[Batch] | None = None
        self._next = 0

    def part(self, k: int) -> Iterator[Batch]:
        """The batches of list `k`: the next part of the one iteration."""
        assert k == self._next, f"parts are read in order: expected {self._next}"
        self._next += 1
        if self._it is None:
            self._it = iter(self.loader)
        it, n = self._it, self.n_batches[k]
        return (next(it) for _ in range(n))
