"""One task's prompt tuning (DESIGN §5), as `pal tune` runs it for k = 1..K.

`train_task` adds task k's prompt slices (Gram–Schmidt init, earlier slices
frozen) and head rows, caches the frozen queries of the task's training
samples and of their reconstruction copies (gathered from `pal frozen`'s
file, or computed here), then trains with AdamW (betas 0.9/`tune.beta2`,
linear warm-up then cosine decay over the task's steps, or a constant lr with
`tune.decay: none`; `tune.clip_norm` clips the gradient) on CE(task k's
classes) + λ·L_r. Every task reseeds its own RNG streams (`task_seed`), so a resumed
run gives the bytes of an uninterrupted one.

`make_step` runs one optimiser step of `losses.loss` or, on a GPU
(`tune.cuda_graphs`, every method), of `losses.static_loss` replayed as a
CUDA graph per batch shape (`pipeline.model.graphs`), clipped or not: a
batch-4 step is otherwise bound by kernel launches.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from palcore.progress import tqdm
from pipeline import params as pparams
from pipeline.data.loader import SampleDataset, WaitClock, index_batches, make_loader
from pipeline.data.pixel_cache import PixelCache
from pipeline.data.samples import Batch, Sample, Tasks, label_sets
from pipeline.model.checkpoint import CheckpointError
from pipeline.model.device import autocast
from pipeline.model.encoder import Backbone
from pipeline.model.graphs import set_lr
from pipeline.model.losses import (
    dummy_segments,
)
from pipeline.model.method import Method
from pipeline.model.network import PalModel, QueryCache, build_cache
from pipeline.model.optim import lr_factor, optimiser_for
from pipeline.model.queries import FrozenQueries
from pipeline.model.steps import Stepper, make_step

log = logging.getLogger(__name__)

CACHE_BATCH = 64  # samples per batch of the frozen query pass


def task_seed(seed: int, task: int) -> int:
    """The seed of task `task`'s RNG streams (init, batch order, patch order)."""
    return seed * 1_000_003 + task


@dataclass
class Session:
    """What one task's training loop needs, built in `_session`."""

    loader: Iterable[Batch]
    optimiser: torch.optim.Optimizer
    base_lrs: list[float]
    step: Stepper
    per_epoch: int
    labels: torch.Tensor  # (n,) int64: the training labels (head-only batches)
    seed: int
    label_sets: torch.Tensor | None = None  # (n, L) multi-label (head-only batches)

    def schedule(
        self, epochs: int, warmup: float, decay: str = "cosine"
    ) -> Callable[[int], float]:
        """The lr factor of the i-th step of the task (`lr_factor`)."""
        total = self.per_epoch * epochs
        return lambda i: lr_factor(i, total, int(warmup * total), decay)


def train_task(
    model: PalModel,
    task: int,
    train: list[Sample],
    tasks: Tasks,
    tune_p: pparams.TuneParams,
    frozen: FrozenQueries | None = None,
    pixels: PixelCache | None = None,
) -> list[dict]:
    """Train step `task` in place; returns its log entries (one per epoch,
    with `seconds`). `frozen`: `pal frozen`'s queries (None: computed here);
    images come from `pixels` when given (same bytes)."""
    if not train:
        raise CheckpointError(f"task {task} has no training samples")
    seed = task_seed(tune_p.seed, task)
    torch.manual_seed(seed)  # patch order of the ViLT embeddings
    model.add_task(torch.Generator().manual_seed(seed))
    model.to(model.backbone.device)
    if tune_p.epochs == 0:  # the "never trained" ablation: init prompts and head
        log.info("task %d: tune.epochs 0, prompts and head stay at their init", task)
        model.eval()
        return []
    session = _session(model, task, train, tasks, tune_p, seed, frozen, pixels)
    model.train()
    entries = [
        _epoch(model, session, task, epoch, tune_p)
        for epoch in range(1, tune_p.epochs + 1)
    ]
    if session.step.graphs is not None:
        replay, steps = session.step.graphs, session.per_epoch * tune_p.epochs
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


def _session(
    model: PalModel,
    task: int,
    train: list[Sample],
    tasks: Tasks,
    tune_p: pparams.TuneParams,
    seed: int,
    frozen: FrozenQueries | None,
    pixels: PixelCache | None = None,
) -> Session:
    """Dataset, frozen queries, optimiser, step and loader of one task."""
    backbone, method = model.backbone, model.prompts
    device = backbone.device
    dataset = _task_dataset(backbone, train, tasks, pixels)
    _hold_prompts(method, task, tune_p.prompt_tasks)
    copies = _trains_copies(method, tune_p.recon_weight)
    cache = _query_cache(model, dataset, task, copies, tune_p.num_workers, frozen)
    graphed = _graphed(device, method, tune_p)
    optimiser, base_lrs = optimiser_for(model, tune_p, capturable=graphed)
    dummy = None
    if graphed and copies:
        dummy = dummy_segments(
            backbone, dataset.empty_ids, dataset.empty_mask, dataset.dummy_image()
        )
    step = make_step(
        model,
        optimiser,
        cache,
        task,
        tune_p.recon_weight,
        static=graphed,
        dummy=dummy,
        graphs=graphed,
        clip_norm=tune_p.clip_norm,
    )
    loader = make_loader(
        dataset,
        tune_p.batch_size,
        copies=copies and not graphed,  # graphed steps splice them on the GPU
        shuffle=True,
        seed=seed,
        num_workers=tune_p.num_workers,
        device=device,
    )
    per_epoch = math.ceil(len(dataset) / tune_p.batch_size)
    labels = torch.tensor([s.label for s in train])
    return Session(
        loader, optimiser, base_lrs, step, per_epoch, labels, seed, dataset.label_sets
    )


def _task_dataset(
    backbone: Backbone, train: list[Sample], tasks: Tasks, pixels: PixelCache | None
) -> SampleDataset:
    """The task's training samples as uint8 items (normalised on the device,
    the same bits), with their label sets on a multi-label prepare."""
    sets = label_sets(train, tasks.label_width, tasks) if tasks.label_width else None
    return SampleDataset(
        train,
        tasks.root,
        backbone.processor,
        backbone.max_text_len,
        backbone.image_side,
        uint8=True,
        pixels=pixels,
        label_sets=sets,
    )


def _trains_copies(method: Method | None, recon_weight: float) -> bool:
    """Whether the task's batches carry the missing-modality copies the
    reconstruction loss trains on: a method with trainable prompts that
    takes copies, and a loss weight above 0."""
    if method is None or not method.copies or recon_weight <= 0:
        return False
    return any(p.requires_grad for p in method.parameters())


def _graphed(
    device: torch.device, method: Method | None, tune_p: pparams.TuneParams
) -> bool:
    """Whether a task's steps replay as CUDA graphs: on a GPU, for a graphable
    method (every method here), unless `tune.cuda_graphs` is false."""
    graphable = method is not None and method.graphable
    return device.type == "cuda" and graphable and tune_p.cuda_graphs


def _hold_prompts(method: torch.nn.Module | None, task: int, prompt_tasks: int) -> None:
    """`tune.prompt_tasks` n > 0: from task n + 1 on, the prompts stay at their
    init (only the head rows train)."""
    if method is not None and 0 < prompt_tasks < task:
        log.info(
            "task %d: tune.prompt_tasks %d, prompts stay at their init",
            task,
            prompt_tasks,
        )
        method.requires_grad_(False)


def _epoch(
    model: PalModel, s: Session, task: int, epoch: int, tune_p: pparams.TuneParams
) -> dict:
    """One epoch over the task's batches; returns its log entry."""
    t0 = time.perf_counter()
    batches = s.loader
    if model.prompts is None:
        batches = index_batches(
            s.labels, tune_p.batch_size, s.seed, epoch, s.label_sets
        )
    clock = WaitClock(batches)
    bar = tqdm(
        clock,
        total=s.per_epoch,
        desc=f"task {task} epoch {epoch}",
        unit="batch",
        disable=None,
        leave=False,
    )
    factor = s.schedule(tune_p.epochs, tune_p.warmup, tune_p.decay)
    sums = torch.zeros(4, dtype=torch.float64, device=model.backbone.device)
    n_seen = 0
    for i, batch in enumerate(bar):
        f = factor((epoch - 1) * s.per_epoch + i)
        set_lr(s.optimiser, [lr * f for lr in s.base_lrs])
        p = s.step(batch)
        row = [p["ce"] * batch.n, p["aux"] * p["aux_rows"], p["correct"], p["aux_rows"]]
        sums += torch.stack(row).double()
        n_seen += batch.n
        if i % 20 == 19 or i == s.per_epoch - 1:
            bar.set_postfix(loss=f"{sums[0].item() / n_seen:.4f}")
    bar.close()
    aux_name = "recon" if model.prompts is None else model.prompts.aux_name
    weight = tune_p.recon_weight
    entry = _entry(task, epoch, s.per_epoch, n_seen, sums, weight, aux_name)
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    entry["data_wait"] = round(clock.seconds, 1)
    log.info(
        "task %d epoch %d: ce %.4f %s %.4f train acc %.1f%% (%.1f s, %.1f s of it "
        "waiting for data)",
        task,
        epoch,
        entry["ce"],
        aux_name,
        entry[aux_name],
        entry["train_acc"],
        entry["seconds"],
        entry["data_wait"],
    )
    return entry


def _entry(
    task: int,
    epoch: int,
    steps: int,
    n_seen: int,
    sums: torch.Tensor,
    weight: float,
    aux_name: str,
) -> dict:
    """One epoch's log entry from its sums (ce·n, aux·rows, correct, rows);
    the auxiliary loss under the method's name (PAL: recon)."""
    ce, aux, correct, rows = sums.tolist()
    entry = {
        "task": task,
        "epoch": epoch,
        "steps": steps,
        "samples": n_seen,
        "ce": round(ce / n_seen, 6),
        aux_name: round(aux / rows, 6) if rows else 0.0,
        "train_acc": round(100.0 * correct / n_seen, 4),
    }
    entry["loss"] = round(entry["ce"] + weight * entry[aux_name], 6)
    return entry


def _query_cache(
    model: PalModel,
    dataset: SampleDataset,
    task: int,
    copies: bool,
    num_workers: int,
    frozen: FrozenQueries | None = None,
) -> QueryCache:
    """Frozen queries of `dataset`'s samples and copies (`frozen`: gathered)."""
    device = model.backbone.device
    if frozen is not None:
        return frozen.cache(dataset.samples, device)
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
