"""`pal frozen`: the frozen backbone's queries of a dataset, once (DESIGN §5).

A sample's frozen, prompt-free pass (`Backbone.queries`: q_t at the text CLS,
q_v at the image CLS) depends only on its image, its text, the state it is in
and the backbone. This stage runs it once per dataset, for every sample the
dataset lists (`pipeline.data.listing`: what every run's prepare folder draws
from; `protocol.vary` moves only the class order and the missing tables,
never the selection) in each of the three states (`palcore.codes.Missing`):

    complete        its text and its image
    text missing    the empty text and its image
    image missing   its text and the dummy image

A sample whose image is naturally absent (not on disk, or does not decode)
can only be image-missing in any run, one whose text is empty only
text-missing: its other states hold NaN (`pipeline.model.queries` says so by
name if a run ever asks for one). Complete samples go through the loader with
their two copies (`Collate` with `copies`), so each image is decoded once.

Its deps are the dataset (images and texts) and the backbone, not the missing
tables, the class order or the task split: runs and grid cells that differ
only in those share one output from DVC's cache. ViLT's HF embedding draws
the patch order from torch's RNG, so the RNG is reseeded per batch (as
`pipeline.model.embed`): same inputs, same bytes.

Reads `data.dataset`, `data.root`, `data.text_field`, `data.per_class`,
`data.label_count`, `data.absent`, the `model` section and `extract.device`
(the device of the pass: bf16 on CUDA as tune and extract run it) and
`extract.num_workers`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click
import numpy as np
import torch

from palcore.cliutil import clean_errors, folder_option, params_option
from palcore.codes import Missing
from palcore.params import Source, section_value
from palcore.progress import tqdm
from pipeline import params as pparams
from pipeline.contracts import write_stamp
from pipeline.data.listing import listed
from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.pixel_cache import PixelCache, open_pixels
from pipeline.data.samples import Sample
from pipeline.model.backbone import load_backbone
from pipeline.model.device import autocast, resolve_device
from pipeline.model.encoder import Backbone
from pipeline.model.queries import batch_queries, queries_path, write_queries
from pipeline.stages.options import pixels_option

log = logging.getLogger(__name__)

BATCH = 64  # samples per batch (each complete one adds two copies)


def dataset_samples(params: pparams.DataParams) -> list[Sample]:
    """Every sample the dataset lists (`pipeline.data.listing.listed`), sorted
    by id, with its natural code as `missing` (task and label unused: 1, 0)."""
    _, kept, _, _ = listed(params)
    samples = [
        Sample(s.id, s.split, 1, 0, s.class_name, image, text or "", int(code))
        for s, code, image, text in kept
    ]
    return sorted(samples, key=lambda s: s.id)


def frozen_pairs(
    backbone: Backbone,
    samples: list[Sample],
    root: str | Path,
    batch_size: int = BATCH,
    num_workers: int = 0,
    pixels: PixelCache | None = None,
) -> np.ndarray:
    """(n, 3, 2, D) float32: (q_t, q_v) of each sample in each state, NaN in
    the states it cannot take. A sample's `missing` is its natural code: 0
    (complete) gives all three states, 1 or 2 that state only."""
    n, D, device = len(samples), backbone.hidden_size, backbone.device
    pairs = np.full((n, len(Missing), 2, D), np.nan, dtype=np.float32)
    dataset = SampleDataset(
        samples,
        Path(root),
        backbone.processor,
        backbone.max_text_len,
        backbone.image_side,
        uint8=True,  # normalised on the device, same bits
        pixels=pixels,  # `pal pixels`: no decoding
    )
    batches = make_loader(
        dataset, batch_size, copies=True, num_workers=num_workers, device=device
    )
    bar = tqdm(total=n, desc="frozen", unit="sample", disable=None, leave=False)
    with torch.inference_mode(), autocast(device), bar:
        for b, batch in enumerate(batches):
            torch.manual_seed(b)  # ViLT's patch order: same batch, same bytes
            q = torch.stack(batch_queries(backbone, batch), 1).float().cpu().numpy()
            m, c = batch.n, len(batch.complete)
            idx = batch.index.numpy()
            pairs[idx, batch.missing.numpy()] = q[:m]  # each row in its own state
            comp = idx[batch.complete.numpy()]
            pairs[comp, Missing.TEXT] = q[m : m + c]  # text-dropped copies
            pairs[comp, Missing.IMAGE] = q[m + c :]  # image-dropped copies
            bar.update(m)
    return pairs


def frozen(
    data_p: pparams.DataParams,
    model_p: pparams.ModelParams,
    out_dir: str | Path,
    device: str = "auto",
    num_workers: int = 0,
    pixels: str | Path | None = None,
) -> Path:
    """List the dataset, run the frozen pass and write `<out>/queries.h5`;
    returns its path. `pixels`: a folder written by `pal pixels`, read
    instead of decoding."""
    dev = resolve_device(device, "extract.device")
    # the backbone first: a bad one stops the stage before the listing's scan
    backbone = load_backbone(model_p.backbone, model_p.max_text_len).place(dev)
    samples = dataset_samples(data_p)
    t0 = time.perf_counter()
    cache = open_pixels(pixels)
    pairs = frozen_pairs(
        backbone, samples, data_p.root, num_workers=num_workers, pixels=cache
    )
    path = write_queries(
        queries_path(out_dir),
        [s.id for s in samples],
        pairs,
        {"backbone": model_p.backbone, "max_text_len": model_p.max_text_len},
    )
    states = int((~np.isnan(pairs[:, :, 0, 0])).sum())
    log.info(
        "wrote %s: %d samples, %d (sample, state) pairs in %.1f s",
        path,
        len(samples),
        states,
        time.perf_counter() - t0,
    )
    return path


def listing_params(source: Source) -> pparams.DataParams:
    """The `data` keys that choose the listed samples, and only those: the
    missing tables, class order and task split are left at their defaults, so
    they cannot reach this stage."""
    keys = {
        "dataset": section_value(source, "data", "dataset"),
        "root": section_value(source, "data", "root"),
        "text_field": section_value(source, "data", "text_field"),
        "per_class": section_value(source, "data", "per_class"),
        "label_count": section_value(source, "data", "label_count"),
        "absent": section_value(source, "data", "absent"),
    }
    return pparams.DataParams(**{k: v for k, v in keys.items() if v is not None})


@click.command("frozen")
@params_option
@folder_option("out", "data/frozen", "Output folder for queries.h5.")
@pixels_option
@clean_errors
def cli(params_file: str, out: str, pixels: str | None) -> None:
    """Run the frozen backbone once over every sample of the dataset.

    For each sample the dataset lists (data.dataset at data.root, after
    data.per_class), in each state it can take (complete, text missing, image
    missing), stores the frozen queries (q_t, q_v) in <out>/queries.h5, which
    `pal tune --frozen` and `pal extract --frozen` read instead of running
    the frozen pass in every run and step. Reads the model section, the data
    keys that choose the samples (not the missing tables or class order) and
    extract.device / extract.num_workers. Same params and data, same bytes.
    """
    source = Source(Path(params_file))
    data_p = listing_params(source)
    model_p = pparams.load(params_file, "model")
    device = section_value(source, "extract", "device") or "auto"
    workers = section_value(source, "extract", "num_workers") or 0
    frozen(data_p, model_p, out, device, int(workers), pixels)
    write_stamp(Path(out), "frozen")
