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
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pipeline import params as pparams
from pipeline.data.loader import SampleDataset, WaitClock, legacy_path, make_loader
from pipeline.data.samples import Sample
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
) -> tuple[np.ndarray, np.ndarray]:
    """Joint embeddings (n, D) float32 and head logits (n, C_k) float32 of
    `samples` (image paths relative to `root`), in order. Also the forward of
    `pal predict`. `queries` (n, 2, D) float32: the samples' stored frozen
    queries (`pal frozen`; None: the frozen pass runs here); a model without
    prompts then needs no image and no forward."""
    backbone = model.backbone
    D, C = backbone.hidden_size, sum(model.classes_per_task[: model.step])
    if not samples:
        return np.zeros((0, D), np.float32), np.zeros((0, C), np.float32)
    device = backbone.device
    q_all = None if queries is None else torch.from_numpy(queries).to(device)
    if q_all is not None and model.prompts is None:
        with torch.inference_mode(), autocast(device):
            x, logits = model.features(None, q_all)
        return x.float().cpu().numpy(), logits.float().cpu().numpy()
    dataset = SampleDataset(
        samples,
        root,
        backbone.processor,
        backbone.max_text_len,
        backbone.image_side,
        uint8=not legacy_path(),  # normalised on the device, same bits
    )
    loader = make_loader(
        dataset, params.batch_size, num_workers=params.num_workers, device=device
    )
    xs, ls = [], []
    clock, t0 = WaitClock(loader), time.perf_counter()
    with (
        torch.inference_mode(),
        autocast(device),
        tqdm(
            total=len(dataset), desc=desc, unit="sample", disable=None, leave=False
        ) as bar,
    ):
        for b, batch in enumerate(clock):
            # ViLT's patch order: the same batch gets the same seed, and bytes
            torch.manual_seed(first_batch + b)
            q = None if q_all is None else q_all[batch.index.to(device)]
            x, logits = model.features(batch, q)
            xs.append(x.float())
            ls.append(logits.float())
            bar.update(batch.n)
    log.info(
        "%s: %d samples in %.1f s, %.1f s of it waiting for data",
        desc,
        len(dataset),
        time.perf_counter() - t0,
        clock.seconds,
    )
    return torch.cat(xs).cpu().numpy(), torch.cat(ls).cpu().numpy()
