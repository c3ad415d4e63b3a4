"""The training loss of one batch, and its static-shape form for CUDA graphs.

`loss` is the definition (DESIGN §5): the loader appends the text-dropped and
image-dropped copies of the batch's complete samples on the host (`Collate`
with `copies`), the rows missing a modality and the copies go through one
reconstruction pass, and

    loss = CE(task's classes) + λ · mean over complete samples of
           ‖q̂_t − q_t‖² + ‖q̂_v − q_v‖²  (stop-gradient targets).

`static_loss` computes the same loss with shapes fixed by the batch's shape,
so a GPU step can be captured and replayed as a CUDA graph
(`pipeline.model.graphs`): text padded to `model.max_text_len` (`static_inputs`),
the copies spliced on the device from the embedded dummy inputs
(`DummySegments`), masks in place of host-side counts. It is an optimisation
of `loss`, held to it by tests/test_static_step.py (loss parts and every
gradient, for every prompt variant). On the CPU it is slower than `loss`
(measured in bench/README.md), so `pal tune` uses it only on CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from palcore.codes import Missing
from pipeline.data.samples import Batch
from pipeline.model.backbone import Backbone, autocast
from pipeline.model.network import PalModel, QueryCache
from pipeline.model.vision import batch_inputs

Parts = dict[str, torch.Tensor]


def loss(
    model: PalModel, batch: Batch, cache: QueryCache, task: int, recon_weight: float
) -> tuple[torch.Tensor, Parts]:
    """Training loss of one batch (with its copies) for `task`; λ =
    `recon_weight`.

    Returns the loss (scalar, with graph) and detached parts: ce, recon
    (0 without complete samples), correct (task-local argmax hits). No host
    synchronisation, so a GPU can run ahead.
    """
    dev = model.backbone.device
    n, c = batch.n, len(batch.complete)
    idx = batch.index.to(dev)
    q = cache.q[idx]  # (n, 2, D)
    q_t, q_v = q[:, 0], q[:, 1]
    lo, hi = model.class_range(task)
    labels = batch.labels.to(dev) - lo
    recon = torch.zeros((), device=dev)
    if model.prompts is None:
        x = q_t
    else:
        ids, am, px, pm = batch_inputs(batch, dev)
        T = ids.shape[1]
        h, mask = model.backbone.embed(ids, am, px, pm, batch.image_sizes)
        extra = None
        if c:
            comp = batch.complete.to(dev)
            qc = cache.copies[
                idx[comp]
            ]  # (c, 2, D): [q_t img-dropped, q_v txt-dropped]
            zeros = torch.zeros_like(qc[:, 0])
            extra = (
                h[n:],
                mask[n:],
                torch.cat([zeros, qc[:, 0]]),
                torch.cat([qc[:, 1], zeros]),
            )
        q_t, q_v, q_hat = model.fill_missing(
            h[:n], mask[:n], T, q_t, q_v, batch.missing, extra
        )
        if c:
            target_t, target_v = q[comp, 0], q[comp, 1]
            recon = (
                (q_hat[:c] - target_t).pow(2).sum(-1)
                + (q_hat[c:] - target_v).pow(2).sum(-1)
            ).mean()
        x = model.joint(h[:n], mask[:n], q_t, q_v)
    logits = model.head(x)[:, lo:hi]
    ce = F.cross_entropy(logits, labels)
    loss = ce + recon_weight * recon
    parts = {
        "ce": ce.detach(),
        "recon": recon.detach(),
        "correct": (logits.argmax(-1) == labels).sum(),
        "complete": torch.full((), c, device=dev),
    }
    return loss, parts


def static_inputs(
    model: PalModel, batch: Batch, rows: int | None = None, min_tokens: int = 0
) -> dict[str, torch.Tensor]:
    """The inputs of `static_loss` for a batch (without copies), on the
    device: h (rows, N, D) and mask (rows, N), the samples embedded with
    their text padded to `max_text_len`; index, missing, labels (rows,).
    With `rows`, the batch is padded to `rows` rows by repeating its first
    sample with label −1; with `min_tokens`, h and mask get masked tokens up
    to N = min_tokens (a batch of very wide photos has fewer image tokens than
    the square dummy image its copies need; masked tokens change nothing).
    Call under `autocast`."""
    dev = model.backbone.device
    n = batch.n
    rows = rows or n
    ids, am, px, pm = (None if t is None else t[:n] for t in batch_inputs(batch, dev))
    sizes = None if batch.image_sizes is None else batch.image_sizes[:n]
    index, missing, labels = (
        t.to(dev, non_blocking=True) for t in (batch.index, batch.missing, batch.labels)
    )
    if rows > n:  # repeat the first sample; its copies get label −1
        sel = torch.cat([torch.arange(n), torch.zeros(rows - n, dtype=torch.int64)])
        sizes = None if sizes is None else sizes[sel]  # host rows, no transfer
        sel = sel.to(dev, non_blocking=True)
        ids, am, px, pm, index, missing, labels = (
            None if t is None else t[sel]
            for t in (ids, am, px, pm, index, missing, labels)
        )
        labels[n:] = -1
    pad = model.backbone.max_text_len - ids.shape[1]
    ids, am = F.pad(ids, (0, pad)), F.pad(am, (0, pad))
    with torch.no_grad():
        h, mask = model.backbone.embed(ids, am, px, pm, sizes)
    if h.shape[1] < min_tokens:
        extra = min_tokens - h.shape[1]
        h, mask = F.pad(h, (0, 0, 0, extra)), F.pad(mask, (0, extra), value=False)
    return {
        "h": h,
        "mask": mask,
        "index": index,
        "missing": missing,
        "labels": labels,
    }


@dataclass
class DummySegments:
    """The embedded dummy inputs, for building reconstruction copies on the device.

    text (T, D) and text_mask (T,) bool: the empty string's token embeddings;
    image (1 + P, D): the all-white image's CLS and patch embeddings.
    """

    text: torch.Tensor
    text_mask: torch.Tensor
    image: torch.Tensor


@torch.no_grad()
def dummy_segments(
    backbone: Backbone,
    empty_ids: torch.Tensor,
    empty_mask: torch.Tensor,
    dummy_image: torch.Tensor,
) -> DummySegments:
    """Embed the dummy text (empty_ids, empty_mask: (T,) int64) and the dummy
    image ((3, S, S) float) once; no RNG is consumed."""
    dev = backbone.device
    ids, am = empty_ids[None].to(dev), empty_mask[None].to(dev)
    with autocast(dev):
        h, mask = backbone.embed_full(ids, am, dummy_image[None].to(dev))
    T = ids.shape[1]
    return DummySegments(h[0, :T], mask[0, :T], h[0, T:])


def _splice_copies(
    h: torch.Tensor,
    mask: torch.Tensor,
    T: int,
    complete: torch.Tensor,
    dummy: DummySegments,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Text-dropped and image-dropped versions of rows (B, N, D), built on the
    device: where `complete` (B,) bool, the text (image) segment is replaced by
    the dummy's, padded with masked tokens to the batch's image length; other
    rows are returned unchanged. Returns h_a, mask_a (text dropped), h_b,
    mask_b (image dropped)."""
    B, N, D = h.shape
    n_img = N - T
    if dummy.image.shape[0] > n_img:
        raise ValueError(
            f"batch image tokens ({n_img}) fewer than the dummy image's "
            f"({dummy.image.shape[0]})"
        )
    pad = n_img - dummy.image.shape[0]
    img = F.pad(dummy.image.to(h.dtype), (0, 0, 0, pad))  # (N - T, D)
    img_mask = torch.arange(n_img, device=h.device) < dummy.image.shape[0]
    c = complete[:, None]
    h_a = torch.cat(
        [torch.where(c[..., None], dummy.text.to(h.dtype), h[:, :T]), h[:, T:]], 1
    )
    mask_a = torch.cat([torch.where(c, dummy.text_mask, mask[:, :T]), mask[:, T:]], 1)
    h_b = torch.cat([h[:, :T], torch.where(c[..., None], img, h[:, T:])], 1)
    mask_b = torch.cat([mask[:, :T], torch.where(c, img_mask, mask[:, T:])], 1)
    return h_a, mask_a, h_b, mask_b


def static_loss(
    model: PalModel,
    inputs: Mapping[str, torch.Tensor],
    cache: QueryCache,
    dummy: DummySegments | None,
    task: int,
    recon_weight: float,
) -> tuple[torch.Tensor, Parts]:
    """`loss` with shapes that depend only on the input shapes.

    The same loss, for a CUDA-graph capture: instead of selecting rows on the
    host, every row gets a text-missing slot and an image-missing slot in one
    reconstruction pass of 2B rows (a complete row's copies are spliced from
    `dummy`; a row missing a modality fills its own slot; unused slots get no
    gradient), and masks stand in for counts.

    inputs (from `static_inputs`): h (B, N, D), mask (B, N):
    embedded samples, text length T = `model.backbone.max_text_len`; index,
    missing, labels (B,) int64 on the device, label −1 marking a padding row.
    `dummy` None: no copies (no reconstruction loss). Returns the loss and
    detached parts: ce, recon, correct, complete (count of complete samples).
    """
    h, mask, index = inputs["h"], inputs["mask"], inputs["index"]
    missing, labels = inputs["missing"], inputs["labels"]
    T = model.backbone.max_text_len
    q = cache.q[index]  # (B, 2, D)
    q_t, q_v = q[:, 0], q[:, 1]
    lo, hi = model.class_range(task)
    valid = labels >= 0
    target = torch.where(valid, labels - lo, -100)
    complete = (missing == Missing.COMPLETE) & valid
    if dummy is None:
        complete = torch.zeros_like(complete)
        h_a, mask_a, h_b, mask_b = h, mask, h, mask
    else:
        h_a, mask_a, h_b, mask_b = _splice_copies(h, mask, T, complete, dummy)
    qc = cache.copies[index]  # [q_t of the image-dropped, q_v of the text-dropped]
    cm = complete[:, None]
    zeros = torch.zeros_like(q_t)
    q_hat = model.reconstruct(
        torch.cat([h_a, h_b]),
        torch.cat([mask_a, mask_b]),
        T,
        torch.cat([zeros, torch.where(cm, qc[:, 0], q_t)]),
        torch.cat([torch.where(cm, qc[:, 1], q_v), zeros]),
        torch.arange(2 * len(h), device=h.device) < len(h),
    )
    B = len(h)
    qt_hat, qv_hat = q_hat[:B], q_hat[B:]
    err = (qt_hat - q_t).pow(2).sum(-1) + (qv_hat - q_v).pow(2).sum(-1)
    n_complete = complete.sum()
    recon = (err * complete).sum() / n_complete.clamp_min(1)
    q_t = torch.where((missing == Missing.TEXT)[:, None], qt_hat, q_t)
    q_v = torch.where((missing == Missing.IMAGE)[:, None], qv_hat, q_v)
    logits = model.head(model.joint(h, mask, q_t, q_v))[:, lo:hi]
    ce = F.cross_entropy(logits, target, ignore_index=-100)
    loss = ce + recon_weight * recon
    parts = {
        "ce": ce.detach(),
        "recon": recon.detach(),
        "correct": ((logits.argmax(-1) == target) & valid).sum(),
        "complete": n_complete,
    }
    return loss, parts
