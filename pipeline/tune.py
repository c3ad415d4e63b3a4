"""`pal tune`: train the prompt pools and the BP head task by task (DESIGN §5).

For k = 1..K: add task k's prompt slices (Gram–Schmidt init, earlier slices
frozen) and head rows, cache the frozen queries of task k's training samples
and of their reconstruction copies, then train with AdamW (betas 0.9/0.98,
linear warm-up then cosine decay over the task's steps) on
CE(task k's classes) + λ·L_r. After each task, `step_XX.pt` is written
atomically into `<out>.partial/` with everything needed to rebuild step k's
model; once every task is done the checkpoints move into `<out>`. A rerun with
the same code, params and inputs resumes after the last finished step with
the same result as an uninterrupted run (every task reseeds its own RNG
streams), also under `dvc repro`, which deletes `<out>` first
(`pipeline.resume`).

On a GPU (`tune.cuda_graphs`, on by default) each step runs `static_loss` —
the same loss with shapes fixed by the batch shape, the reconstruction copies
built on the device — and is replayed as a CUDA graph per batch shape
(`pipeline.graphs`): a batch-4 step is otherwise bound by kernel launches.

Reads params `model`, `prompt`, `tune` and the task split from tasks.json.
Writes `<out>/step_XX.pt` and `<out>/log.jsonl` (one line per task and epoch:
loss parts and train accuracy; same inputs, same bytes). Each epoch's seconds
go to `--timings` (default `logs/tune.jsonl`), outside what DVC tracks.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import click
import torch
from tqdm import tqdm

from pipeline import params as pparams
from pipeline.backbone import (
    Backbone,
    autocast,
    backbone_folder,
    load_backbone,
    resolve_device,
)
from pipeline.checkpoint import (
    CheckpointError,
    checkpoint_path,
    load_checkpoint,
    params_record,
    restore,
    save_checkpoint,
)
from pipeline.graphs import GraphedSteps, capturable_adamw, set_lr
from pipeline.loader import SampleDataset, make_loader
from pipeline.losses import (
    DummySegments,
    Parts,
    dummy_segments,
    loss,
    static_inputs,
    static_loss,
)
from pipeline.model import PalModel, QueryCache, build_cache
from pipeline.resume import (
    PartialRun,
    code_digest,
    file_digest,
    folder_digest,
    signature,
)
from pipeline.samples import (
    SAMPLES_FILE,
    TASKS_FILE,
    Batch,
    Sample,
    Tasks,
    read_prepare,
    select,
)
from solver.cliutil import clean_errors, folder_option, params_option
from solver.outputs import write_bytes_atomic

log = logging.getLogger(__name__)

BETAS = (0.9, 0.98)
LOG_NAME = "log.jsonl"
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


def tune(
    prepare_dir: str | Path,
    out_dir: str | Path,
    model_p: pparams.ModelParams,
    prompt_p: pparams.PromptParams,
    tune_p: pparams.TuneParams,
    fresh: bool = False,
    timings: str | Path | None = None,
) -> list[Path]:
    """Run prompt tuning for all tasks; returns the checkpoint paths.

    Finished steps wait in `<out>.partial/` until every task is done, then
    move into `out` (see `pipeline.resume`); `fresh` discards them. Per-epoch
    seconds are appended to `timings` (a JSON-lines file), never to `out`.
    """
    samples, tasks = read_prepare(prepare_dir)
    out = Path(out_dir)
    record = params_record(model_p, prompt_p, tune_p, tasks.n_tasks)
    device = resolve_device(tune_p.device, "tune.device")
    backbone = load_backbone(model_p.backbone, model_p.max_text_len).place(device)
    model = PalModel(backbone, prompt_p, tasks.classes_per_task).to(device)
    partial = PartialRun(
        out, _signature(prepare_dir, record, backbone, device), fresh=fresh
    )
    done = _resume(model, partial.path, tasks)
    entries = [e for e in _read_log(partial.path) if e.get("task", 0) <= done]
    if done:
        log.info(
            "reusing steps 1-%d of an interrupted run with the same code, params "
            "and inputs (%s)",
            done,
            partial.path,
        )
    for task in range(done + 1, tasks.n_tasks + 1):
        train = select(samples, "train", [task])
        epochs = train_task(model, task, train, tasks, tune_p)
        for entry in epochs:  # timings stay out of the DVC output
            seconds = entry.pop("seconds")
            if timings is not None:
                _append_timing(Path(timings), dict(entry, seconds=seconds))
        entries += epochs
        path = checkpoint_path(partial.path, task)
        digest = save_checkpoint(
            path, task, record, tasks.record(), model.tuned_state()
        )
        _write_log(partial.path, entries)
        log.info("step %d done: %s (%s)", task, path.name, digest[:12])
    names = [checkpoint_path("", k).name for k in range(1, tasks.n_tasks + 1)]
    for stale in out.glob("step_*.pt"):  # steps of an earlier run with more tasks
        if stale.name not in names:
            stale.unlink()
    partial.finish([*names, LOG_NAME])
    log.info("wrote %s (%d steps)", out, tasks.n_tasks)
    return [checkpoint_path(out, k) for k in range(1, tasks.n_tasks + 1)]


def _signature(
    prepare_dir: str | Path, record: dict, backbone: Backbone, device: torch.device
) -> str:
    """What the checkpoints depend on: tune's code, params, the prepared
    samples and task split, the backbone's files, the device type and the
    versions of torch and transformers."""
    import transformers

    prepare = Path(prepare_dir)
    return signature(
        {
            "code": code_digest(__name__),
            "params": record,
            "samples": file_digest(prepare / SAMPLES_FILE),
            "tasks": file_digest(prepare / TASKS_FILE),
            "backbone": folder_digest(backbone_folder(backbone.name)),
            "device": device.type,
            "versions": [torch.__version__, transformers.__version__],
        }
    )


def _resume(model: PalModel, folder: Path, tasks: Tasks) -> int:
    """Load the last of the consecutive checkpoints 1..k in `folder` into
    `model` (a run with this signature wrote them); returns k."""
    done, state = 0, None
    for k in range(1, tasks.n_tasks + 1):
        path = checkpoint_path(folder, k)
        if not path.exists():
            break
        ckpt = load_checkpoint(path)
        if ckpt["step"] != k:
            raise CheckpointError(f"{path}: holds step {ckpt['step']}, expected {k}")
        done, state = k, ckpt["state"]
    if done:
        restore(model, state, done)
    return done


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
    backbone = model.backbone
    dataset = SampleDataset(
        train,
        tasks.root,
        backbone.processor,
        backbone.max_text_len,
        backbone.image_side,
    )
    copies = model.prompts is not None and tune_p.recon_weight > 0
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
        bar = tqdm(
            batches,
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
        log.info(
            "task %d epoch %d: ce %.4f recon %.4f train acc %.1f%% (%.1f s)",
            task,
            epoch,
            entry["ce"],
            entry["recon"],
            entry["train_acc"],
            entry["seconds"],
        )
        entries.append(entry)
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
    log.debug(
        "task %d: cached queries of %d samples in %.1f s",
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

    def run(batch: Batch) -> Parts:
        nonlocal rows
        rows = rows or batch.n  # the first batch is a full one
        with autocast(device):
            inputs = static_inputs(model, batch, rows)
        return replay(inputs)

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


def _read_log(out: Path) -> list[dict]:
    path = out / LOG_NAME
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a damaged log line is rewritten from the checkpoints' runs
    return entries


def _write_log(out: Path, entries: list[dict]) -> None:
    text = "".join(json.dumps(e) + "\n" for e in entries)
    write_bytes_atomic(out / LOG_NAME, text.encode())


def _append_timing(path: Path, entry: dict) -> None:
    """One JSON line per epoch; timings vary between identical runs, so they
    live outside the DVC-tracked output."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


@click.command("tune")
@params_option
@folder_option(
    "prepare", "data/prepare", "Folder written by `pal prepare`.", dest="prepare_dir"
)
@folder_option(
    "out", "data/tune", "Folder for step_XX.pt and log.jsonl.", dest="out_dir"
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Discard the finished steps of an interrupted run (<out>.partial/) "
    "instead of resuming after them.",
)
@click.option(
    "--timings",
    default="logs/tune.jsonl",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="JSON-lines file that gets each epoch's losses and seconds appended.",
)
@clean_errors
def cli(
    params_file: str, prepare_dir: str, out_dir: str, fresh: bool, timings: str
) -> None:
    """Tune the prompt pools and the BP head, task by task.

    For each task k the new prompt slices and head rows are trained on task k's
    training samples (CE over its classes + tune.recon_weight × reconstruction
    loss); step_XX.pt holds everything needed to rebuild step k's model.
    Finished steps wait in <out>.partial/ until the last task is done: an
    interrupted run (also under `dvc repro`) resumes after its last finished
    step when its code, params and inputs are unchanged. Reads params sections
    model, prompt and tune.
    """
    model_p = pparams.load(params_file, "model")
    prompt_p = pparams.load(params_file, "prompt")
    tune_p = pparams.load(params_file, "tune")
    tune(prepare_dir, out_dir, model_p, prompt_p, tune_p, fresh=fresh, timings=timings)
