"""One task's prompt tuning (DESIGN §5), as `pal tune` runs it for k = 1..K.

`train_task` adds task k's prompt slices (Gram–Schmidt init, earlier slices
frozen) and head rows, caches the frozen queries of the task's training
samples and of their reconstruction copies, then trains with AdamW (betas
0.9/0.98, linear warm-up then cosine decay over the task's steps) on
CE(task k's classes) + λ·L_r. Every task reseeds its own RNG streams
(`task_seed`), so a resumed run gives the bytes of an uninterrupted one.

`make_step` runs one optimiser step of `losses.loss` or, on a GPU
(`tune.cuda_graphs`), of `losses.static_loss` replayed as a CUDA graph per
batch shape (`pipeline.model.graphs`): a batch-4 step is otherwise bound by kernel
launches.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping

import torch
from tqdm import tqdm

from pipeline import params as pparams
from pipeline.data.loader import SampleDataset, WaitClock, legacy_path, make_loader
from pipeline.data.samples import Batch, Sample, Tasks
from pipeline.model.backbone import autocast
from pipeline.model.checkpoint import CheckpointError
from pipeline.model.graphs import GraphedSteps, capturable_adamw, set_lr
from pipeline.model.losses import (
    DummySegments,
    Parts,
    dummy_segments,
    loss,
    static_inputs,
    static_loss,
)
from pipeline.model.network import PalModel, QueryCache, build_cache

log = logging.getLogger(__name__)

BETAS = (0.9, 0.98)
CACHE_BATCH = 64  # samples per batch of the frozen query pass


def task_seed(seed: int, task: int) -> int:
    """The seed of task `task`'s RNG streams (init, batch order, patch order)."""
    return seed * 1_000_003 + task


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_task(
    model: PalModel,
    task: int,
    train: list[Sample],
    tasks: Tasks,
    tune_p: pparams.TuneParams,
) -> list[dict]:
    """Train step `task` in place; returns its log entries (one per epoch,
    with `seconds`)."""
    if not train:
        raise CheckpointError(f"task {task} has no training samples")
    device = model.backbone.device
    seed = task_seed(tune_p.seed, task)
    torch.manual_seed(seed)  # patch order of the ViLT embeddings
    model.add_task(torch.Generator().manual_seed(seed))
    model.to(device)
    if tune_p.epochs == 0:  # the "never trained" ablation: init prompts and head
        log.info("task %d: tune.epochs 0, prompts and head stay at their init", task)
        model.eval()
        return []
    backbone = model.backbone
    dataset = SampleDataset(
        train,
        tasks.root,
        backbone.processor,
        backbone.max_text_len,
        backbone.image_side,
        uint8=not legacy_path(),  # normalised on the device, same bits
    )
    if model.prompts is not None and 0 < tune_p.prompt_tasks < task:
        log.info("task %d: tune.prompt_tasks %d, prompts stay at their init",
                 task, tune_p.prompt_tasks)  # fmt: skip
        model.prompts.requires_grad_(False)
    prompted = model.prompts is not None and any(
        p.requires_grad for p in model.prompts.parameters()
    )
    copies = prompted and tune_p.recon_weight > 0
    cache = _query_cache(model, dataset, task, copies, tune_p.num_workers)
    graphed = device.type == "cuda" and model.prompts is not None and tune_p.cuda_graphs
    optimiser, base_lrs = _optimiser(model, tune_p, capturable=graphed)
    dummy = (
        dummy_segments(
            backbone, dataset.empty_ids, dataset.empty_mask, dataset.dummy_image()
        )
        if graphed and copies
        else None
    )
    run_step = make_step(
        model,
        optimiser,
        cache,
        task,
        tune_p.recon_weight,
        static=graphed,
        dummy=dummy,
        graphs=graphed,
    )
    per_epoch = math.ceil(len(dataset) / tune_p.batch_size)
    total = per_epoch * tune_p.epochs
    warmup = int(tune_p.warmup * total)
    loader = make_loader(
        dataset,
        tune_p.batch_size,
        copies=copies and not graphed,  # graphed steps splice them on the GPU
        shuffle=True,
        seed=seed,
        num_workers=tune_p.num_workers,
        device=device,
    )
    labels = torch.tensor([s.label for s in train])
    model.train()
    entries = []
    for epoch in range(1, tune_p.epochs + 1):
        t0 = time.perf_counter()
        batches = (
            loader
            if model.prompts is not None
            else _index_batches(labels, tune_p.batch_size, seed, epoch)
        )
        clock = WaitClock(batches)
        bar = tqdm(
            clock,
            total=per_epoch,
            desc=f"task {task} epoch {epoch}",
            unit="batch",
            disable=None,
            leave=False,
        )
        # ce·n, recon·c, correct, c (complete samples)
        sums = torch.zeros(4, dtype=torch.float64, device=device)
        n_seen = 0
        for i, batch in enumerate(bar):
            factor = lr_factor((epoch - 1) * per_epoch + i, total, warmup)
            set_lr(optimiser, [lr * factor for lr in base_lrs])
            parts = run_step(batch)
            sums += torch.stack(
                [
                    parts["ce"] * batch.n,
                    parts["recon"] * parts["complete"],
                    parts["correct"],
                    parts["complete"],
                ]
            ).double()
            n_seen += batch.n
            if i % 20 == 19 or i == per_epoch - 1:
                bar.set_postfix(loss=f"{sums[0].item() / n_seen:.4f}")
        bar.close()
        entry = _entry(task, epoch, per_epoch, n_seen, sums, tune_p.recon_weight)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        entry["data_wait"] = round(clock.seconds, 1)
        log.info(
            "task %d epoch %d: ce %.4f recon %.4f train acc %.1f%% "
            "(%.1f s, %.1f s of it waiting for data)",
            task,
            epoch,
            entry["ce"],
            entry["recon"],
            entry["train_acc"],
            entry["seconds"],
            entry["data_wait"],
        )
        entries.append(entry)
    replay = getattr(run_step, "graphs", None)
    if replay is not None:
        steps = per_epoch * tune_p.epochs
        log.info(
            "task %d: %d of %d steps replayed a CUDA graph (%d graphs, captured "
            "in %.1f s)",
            task,
            steps - replay.eager_steps,
            steps,
            len(replay.graphs),
            replay.capture_seconds,
        )
    model.eval()
    return entries


def _entry(
    task: int, epoch: int, steps: int, n_seen: int, sums: torch.Tensor, weight: float
) -> dict:
    """One epoch's log entry from its sums (ce·n, recon·c, correct, c)."""
    ce, recon, correct, n_complete = sums.tolist()
    entry = {
        "task": task,
        "epoch": epoch,
        "steps": steps,
        "samples": n_seen,
        "ce": round(ce / n_seen, 6),
        "recon": round(recon / n_complete, 6) if n_complete else 0.0,
        "train_acc": round(100.0 * correct / n_seen, 4),
    }
    entry["loss"] = round(entry["ce"] + weight * entry["recon"], 6)
    return entry


def _query_cache(
    model: PalModel,
    dataset: SampleDataset,
    task: int,
    copies: bool,
    num_workers: int,
) -> QueryCache:
    """The frozen queries of `dataset`'s samples (and of their copies)."""
    device = model.backbone.device
    t0 = time.perf_counter()
    batches = make_loader(
        dataset, CACHE_BATCH, copies=copies, num_workers=num_workers, device=device
    )
    with (
        autocast(device),
        tqdm(
            total=len(dataset),
            desc=f"task {task} queries",
            unit="sample",
            disable=None,
            leave=False,
        ) as bar,
    ):
        cache = build_cache(model, batches, len(dataset), bar)
    log.info(
        "task %d: frozen queries of %d samples in %.1f s",
        task,
        len(dataset),
        time.perf_counter() - t0,
    )
    return cache


def _optimiser(
    model: PalModel, tune_p: pparams.TuneParams, capturable: bool
) -> tuple[torch.optim.Optimizer, list[float]]:
    """AdamW over the head rows (`tune.head_lr`) and prompt slices (`tune.lr`)
    being trained; returns it and the groups' base learning rates."""
    device = model.backbone.device
    head = [p for p in model.head.parameters() if p.requires_grad]
    prompts = [p for p in model.trainable_parameters() if all(p is not h for h in head)]
    groups = [{"params": head, "lr": tune_p.head_lr or tune_p.lr}]
    if prompts:
        groups.append({"params": prompts, "lr": tune_p.lr})
    base_lrs = [g["lr"] for g in groups]
    opt_args = {"betas": BETAS, "weight_decay": tune_p.weight_decay}
    if capturable:
        return capturable_adamw(groups, device, **opt_args), base_lrs
    # fused: one kernel for all parameters
    fused = device.type == "cuda"
    return torch.optim.AdamW(groups, fused=fused, **opt_args), base_lrs


StepRunner = Callable[[Batch], Parts]


def make_step(
    model: PalModel,
    optimiser: torch.optim.Optimizer,
    cache: QueryCache,
    task: int,
    recon_weight: float,
    static: bool = False,
    dummy: DummySegments | None = None,
    graphs: bool = False,
) -> StepRunner:
    """One optimiser step per batch.

    static=False: `loss` on the batch as the loader made it (with copies).
    static=True: `static_loss`; the loader must not add copies, they are
    spliced from `dummy` (None: no reconstruction loss), and a short last
    batch is padded to a full one with rows labelled −1, which count for
    nothing. graphs=True (CUDA): each static step is replayed as a CUDA graph
    per batch shape (`GraphedSteps`).
    """
    device = model.backbone.device
    if not static:

        def eager(batch: Batch) -> Parts:
            with autocast(device):
                value, parts = loss(model, batch, cache, task, recon_weight)
            optimiser.zero_grad(set_to_none=True)
            value.backward()
            optimiser.step()
            return parts

        return eager

    def step(inputs: Mapping[str, torch.Tensor]) -> Parts:
        with autocast(device, cache_enabled=False):
            value, parts = static_loss(model, inputs, cache, dummy, task, recon_weight)
        value.backward()
        optimiser.step()
        return parts

    def unrecorded(inputs: Mapping[str, torch.Tensor]) -> Parts:
        optimiser.zero_grad(set_to_none=True)
        return step(inputs)

    replay = GraphedSteps(step, optimiser) if graphs else unrecorded
    rows = None
    # room for the dummy image's tokens in the copies of a batch of wide photos
    T = model.backbone.max_text_len
    min_tokens = T + dummy.image.shape[0] if dummy is not None else 0

    def run(batch: Batch) -> Parts:
        nonlocal rows
        rows = rows or batch.n  # the first batch is a full one
        with autocast(device):
            inputs = static_inputs(model, batch, rows, min_tokens)
        return replay(inputs)

    run.graphs = replay if graphs else None  # GraphedSteps: its counts for the log
    return run


def _index_batches(
    labels: torch.Tensor, batch_size: int, seed: int, epoch: int
) -> Iterator[Batch]:
    """Batches of indices and labels only (the head-only run of
    `prompt.enabled: false` trains on cached queries, no images needed)."""
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
        )
