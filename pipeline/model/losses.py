"""The training loss of one batch, and its static-shape form for CUDA graphs.

`loss` is the definition (DESIGN §5): the batch's embedded samples, their
frozen queries (from the `QueryCache`) and, for a method that asks for them
(PAL), the text-dropped and image-dropped copies of its complete samples that
the loader appended on the host (`Collate` with `copies`), go to the prompt
method (`pipeline.methods`), and

    loss = CE(the task's classes, or every class seen: `train_range`)
           + λ · the method's auxiliary loss (PAL: mean over complete
             samples of ‖q̂_t − q_t‖² + ‖q̂_v − q_v‖², stop-gradient targets)

with λ = `tune.recon_weight`. On a multi-label prepare (`Batch.label_sets`)
CE is BCE over the same classes, each sample's labels among them its
multi-hot target (mean over rows and classes, as RebQ trains MM-IMDb), for
every method alike; the parts keep the name `ce`.

`static_loss` computes the same loss with shapes fixed by the batch's shape,
so a GPU step can be captured and replayed as a CUDA graph
(`pipeline.model.graphs`): text padded to a bucket of the batch's longest
(`static_inputs`, `text_bucket`),
the copies spliced on the device from the embedded dummy inputs
(`DummySegments`), masks in place of host-side counts. It is an optimisation
of `loss` for graphable methods (every method), held to it by
tests/test_static_step.py (PAL's loss parts and every gradient, for every
prompt variant) and tests/test_static_baselines.py (the other methods). On
the CPU it is slower than `loss` (measured in bench/README.md), so `pal tune`
uses it only on CUDA.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from palcore.codes import Missing
from pipeline.data.samples import Batch
from pipeline.model.device import autocast
from pipeline.model.encoder import Backbone
from pipeline.model.method import Copies, Out, StaticView, View
from pipeline.model.network import PalModel, QueryCache
from pipeline.model.vision import batch_inputs

Parts = dict[str, torch.Tensor]


def loss(
    model: PalModel,
    batch: Batch,
    cache: QueryCache,
    task: int,
    recon_weight: float,
) -> tuple[torch.Tensor, Parts]:
    """Training loss of one batch (with its copies) for `task`: CE over the
    classes `model.train_range(task)` + `recon_weight` × the method's auxiliary
    loss.

    Returns the loss (scalar, with graph) and detached parts: ce, aux,
    aux_rows (the rows aux is a mean over; PAL: complete samples), correct
    (argmax hits within the CE's classes). No host synchronisation, so a GPU
    can run ahead; the host->device copies do not wait (the loader pins
    its batches on CUDA).
    """
    dev = model.backbone.device
    n = batch.n
    idx = batch.index.to(dev, non_blocking=True)
    q = cache.q[idx]  # (n, 2, D)
    lo, hi = model.train_range(task)
    labels = batch.labels.to(dev, non_blocking=True) - lo
    if model.prompts is None:
        zero = torch.zeros((), device=dev)
        out = Out(q[:, 0], zero, zero)
    else:
        ids, am, px, pm = batch_inputs(batch, dev)
        h, mask = model.backbone.embed(ids, am, px, pm, batch.image_sizes)
        view = View(h[:n], mask[:n], ids.shape[1], q[:, 0], q[:, 1], batch.missing)
        view.task = task
        if len(batch.complete) and model.prompts.copies:
            comp = batch.complete.to(dev, non_blocking=True)
            view.copies = _copies(h, mask, n, idx, comp, cache)
        out = model.prompts.features(model.backbone, view)
    logits = model.head(out.x)[:, lo:hi]
    sets = batch.label_sets
    if sets is not None:
        sets = sets.to(dev, non_blocking=True)
    ce, correct = head_loss(logits, labels, sets, lo)
    return ce + recon_weight * out.aux, {
        "ce": ce.detach(),
        "aux": out.aux.detach(),
        "aux_rows": out.aux_rows,
        "correct": correct,
    }


def head_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    label_sets: torch.Tensor | None,
    lo: int,
    valid: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, hits) of the head's logits (B, C) over classes [lo, lo + C).

    Single-label (`label_sets` None): CE against `target` (B,) (labels − lo,
    −100 where not `valid`); hits: argmax equal to it. Multi-label:
    `label_sets` (B, L) int64 labels with −1 padding, whose labels in the
    range make each row's multi-hot target; BCE with logits averaged over
    the classes and the `valid` rows (all rows without `valid`); hits:
    argmax among the row's labels."""
    if label_sets is None:
        ce = F.cross_entropy(logits, target, ignore_index=-100)
        hit = logits.argmax(-1) == target
        return ce, (hit if valid is None else hit & valid).sum()
    width = logits.shape[1]
    idx = label_sets - lo
    inside = (idx >= 0) & (idx < width)
    hot = torch.zeros(len(idx), width + 1, device=logits.device, dtype=logits.dtype)
    hot.scatter_(1, torch.where(inside, idx, width), 1.0)
    hot = hot[:, :width]
    per_row = F.binary_cross_entropy_with_logits(logits, hot, reduction="none").mean(1)
    hit = hot.gather(1, logits.argmax(-1, keepdim=True))[:, 0] > 0
    if valid is None:
        return per_row.mean(), hit.sum()
    w = valid.to(per_row.dtype)
    return (per_row * w).sum() / w.sum().clamp(min=1), (hit & valid).sum()


def _copies(
    h: torch.Tensor,
    mask: torch.Tensor,
    n: int,
    idx: torch.Tensor,
    comp: torch.Tensor,
    cache: QueryCache,
) -> Copies:
    """The copies the loader appended after a batch's n samples (rows n: of h
    and mask), with their frozen queries from the cache."""
    qc = cache.copies[idx[comp]]  # (c, 2, D): [q_t img-dropped, q_v txt-dropped]
    zeros = torch.zeros_like(qc[:, 0])
    return Copies(
        h[n:],
        mask[n:],
        torch.cat([zeros, qc[:, 0]]),
        torch.cat([qc[:, 1], zeros]),
        comp,
    )


TEXT_BUCKET = 8  # static text lengths are multiples of it (each a graph shape)


def text_bucket(length: int, max_text_len: int) -> int:
    """The static text length of a batch whose longest text has `length`
    tokens: rounded up to a multiple of `TEXT_BUCKET`, at most
    `max_text_len` (Food101's titles: 16–40 for 40, against 40 always)."""
    return min(max_text_len, -(-length // TEXT_BUCKET) * TEXT_BUCKET)


def static_inputs(
    model: PalModel,
    batch: Batch,
    rows: int | None = None,
    min_image_tokens: int = 0,
) -> dict[str, torch.Tensor]:
    """The inputs of `static_loss` for a batch (without copies), on the
    device: h (rows, N, D) and mask (rows, N), the samples embedded with
    their text padded to T = `text_bucket` of the batch's longest;
    text_mask (rows, T), the text's part of mask (its width is T for
    `static_loss`); index, missing, labels (rows,); label_sets (rows, L)
    for a multi-label batch (padding rows −1).
    With `rows`, the batch is padded to `rows` rows by repeating its first
    sample with label −1; with `min_image_tokens`, h and mask get masked
    tokens up to N = T + min_image_tokens (a batch of very wide photos has
    fewer image tokens than the square dummy image its copies need; masked
    tokens change nothing). Call under `autocast`."""
    n = batch.n
    t, sizes = _sample_rows(batch, model.backbone.device)
    if rows is not None and rows > n:  # repeat the first sample; label −1
        t, sizes = _pad_rows(t, sizes, n, rows)
    ids, am = t.pop("ids"), t.pop("am")
    T = text_bucket(ids.shape[1], model.backbone.max_text_len)
    pad = T - ids.shape[1]
    ids, am = F.pad(ids, (0, pad)), F.pad(am, (0, pad))
    with torch.no_grad():
        h, mask = model.backbone.embed(ids, am, t.pop("px"), t.pop("pm", None), sizes)
    if h.shape[1] < T + min_image_tokens:
        extra = T + min_image_tokens - h.shape[1]
        h, mask = F.pad(h, (0, 0, 0, extra)), F.pad(mask, (0, extra), value=False)
    return {"h": h, "mask": mask, "text_mask": mask[:, :T], **t}


def _sample_rows(
    batch: Batch, dev: torch.device
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """The batch's n samples (no copies) on the device: ids, am, px, pm
    (absent for uint8 images), index, missing, labels and label_sets
    (multi-label only); and their image sizes, on the host."""
    n = batch.n
    ids, am, px, pm = batch_inputs(batch, dev)
    t = {"ids": ids[:n], "am": am[:n], "px": px[:n]}
    if pm is not None:
        t["pm"] = pm[:n]
    for name in ("index", "missing", "labels", "label_sets"):
        value = getattr(batch, name)
        if value is not None:
            t[name] = value.to(dev, non_blocking=True)
    sizes = None if batch.image_sizes is None else batch.image_sizes[:n]
    return t, sizes


def _pad_rows(
    t: dict[str, torch.Tensor], sizes: torch.Tensor | None, n: int, rows: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """`_sample_rows`' tensors padded to `rows` rows by repeating the first
    sample, its copies labelled −1 (and label set −1) so they count for
    nothing."""
    sel = torch.cat([torch.arange(n), torch.zeros(rows - n, dtype=torch.int64)])
    sizes = None if sizes is None else sizes[sel]  # host rows, no transfer
    sel = sel.to(t["labels"].device, non_blocking=True)
    t = {name: value[sel] for name, value in t.items()}
    t["labels"][n:] = -1
    if "label_sets" in t:
        t["label_sets"][n:] = -1
    return t, sizes


@dataclass
class DummySegments:
    """The embedded dummy inputs, for building reconstruction copies on the device.

    text (T, D) and text_mask (T,) bool: the empty string's token embeddings,
    T = `max_text_len` (a batch of shorter text takes its first tokens);
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


def splice_copies(
    h: torch.Tensor,
    mask: torch.Tensor,
    T: int,
    complete: torch.Tensor,
    dummy: DummySegments,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Text-dropped and image-dropped versions of rows (B, N, D), built on the
    device: where `complete` (B,) bool, the text (image) segment is replaced by
    the dummy's (its first T tokens), padded with masked tokens to the batch's
    image length; other rows are returned unchanged. Returns h_a, mask_a (text
    dropped), h_b, mask_b (image dropped)."""
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
    text, text_mask = dummy.text[:T].to(h.dtype), dummy.text_mask[:T]
    h_a = torch.cat([torch.where(c[..., None], text, h[:, :T]), h[:, T:]], 1)
    mask_a = torch.cat([torch.where(c, text_mask, mask[:, :T]), mask[:, T:]], 1)
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
    """`loss` with shapes that depend only on the input shapes (a graphable
    method's `static_features`), for a CUDA-graph capture: masks stand in
    for counts and host-side row selection.

    inputs (from `static_inputs`): h (B, N, D), mask (B, N): embedded
    samples, text length T = text_mask's width; index, missing,
    labels (B,) int64 on the device, label −1 marking a padding row;
    label_sets (B, L) on a multi-label batch (BCE, `head_loss`).
    `dummy` None: no copies (no reconstruction loss). Returns the loss and
    the parts of `loss`.

    The method's `static_features` gets a `StaticView`: h, mask, T; copies (h_a,
    mask_a, h_b, mask_b) (`splice_copies`; the rows themselves without
    `dummy`); q_t, q_v (B, D) frozen queries and qc (B, 2, D) those of the
    copies; missing (B,) int64, complete (B,) bool (rows whose copies
    count) and valid (B,) bool (not padding), all on the device; task, the
    training task (int, 1-based).
    """
    lo, hi = model.train_range(task)
    view = _static_view(inputs, cache, dummy, task)
    target = torch.where(view.valid, inputs["labels"] - lo, -100)
    # static steps run only for a graphable method (`pipeline.model.steps`)
    assert model.prompts is not None, "a static step without a prompt method"
    out = model.prompts.static_features(model.backbone, view)
    logits = model.head(out.x)[:, lo:hi]
    ce, correct = head_loss(logits, target, inputs.get("label_sets"), lo, view.valid)
    return ce + recon_weight * out.aux, {
        "ce": ce.detach(),
        "aux": out.aux.detach(),
        "aux_rows": out.aux_rows,
        "correct": correct,
    }


def _static_view(
    inputs: Mapping[str, torch.Tensor],
    cache: QueryCache,
    dummy: DummySegments | None,
    task: int,
) -> StaticView:
    """What a method's `static_features` reads: the rows, their copies and
    frozen queries, and the masks standing in for counts (`static_loss`)."""
    index, missing, labels = inputs["index"], inputs["missing"], inputs["labels"]
    q = cache.q[index]  # (B, 2, D)
    valid = labels >= 0
    complete = (missing == Missing.COMPLETE) & valid
    h, mask, T = inputs["h"], inputs["mask"], inputs["text_mask"].shape[1]
    if dummy is None:
        complete = torch.zeros_like(complete)
        copies = (h, mask, h, mask)
    else:
        copies = splice_copies(h, mask, T, complete, dummy)
    return StaticView(
        h=h,
        mask=mask,
        T=T,
        copies=copies,
        q_t=q[:, 0],
        q_v=q[:, 1],
        qc=cache.copies[index],  # [q_t image-dropped, q_v text-dropped]
        missing=missing,
        complete=complete,
        valid=valid,
        task=task,
    )
